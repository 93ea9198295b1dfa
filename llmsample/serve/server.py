"""Running the app: uvicorn on a socket bound here (so ``--port 0`` reports the port it got) on a
thread beside the engine's loop, and SIGTERM as a clean ending: no new connections, every in-flight
row cancelled so its stream ends with a final chunk and ``[DONE]``, then exit 0."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from llmsample.errors import ENDING_SIGNALS, RuntimeFailure, UserError, first_line

if TYPE_CHECKING:
    from llmsample.serve.engine import Engine

EVERY_INTERFACE = ("0.0.0.0", "::", "")


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A server on every interface without a key serves anyone who can reach the machine."""
    if host not in EVERY_INTERFACE or api_key:
        return None
    return (
        f"Warning: listening on every interface ({host or '*'}) without an API key: anyone who can reach this "
        "machine can use the model; pass --api-key KEY (or set LLMSAMPLE_API_KEY)"
    )


def bind(host: str, port: int) -> socket.socket:
    """The listening socket; a port in use or a host that is not ours is one line, exit 2."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class CancelledStreams(logging.Filter):
    """A stream whose client stopped reading cannot send its final chunk, so a shutdown ends it by
    cancelling its task (a second Ctrl-C, or uvicorn's graceful timeout), and uvicorn logs each
    cancelled task as a 45-line traceback ending in ``CancelledError``: one line each instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError)):
            return True
        message = "llmsample serve: a stream was cut off at shutdown (its client was not reading it)"
        print(message, file=sys.stderr, flush=True)
        return False


def serve_forever(
    app: object,
    sock: socket.socket,
    engine: Engine,
    ready: Callable[[], None],
    read_timeout: float = 30.0,
    log_level: str = "warning",
) -> None:
    """Serve until SIGTERM, SIGHUP or Ctrl-C: uvicorn on a thread of its own, the engine on this
    one (the thread that loaded the model, see :mod:`llmsample.serve.engine`). ``ready`` is called
    once a signal stops the server cleanly. The first signal stops accepting and ends every row
    (``engine.shutdown``, on a thread of its own: a handler must not wait for a lock the
    interrupted loop may hold); a second Ctrl-C stops waiting for streams. Uvicorn ending by
    itself ends the engine too and raises :class:`RuntimeFailure` (exit 1). A connection that has
    not sent a request's headers within ``read_timeout`` seconds is closed."""
    import uvicorn

    from llmsample.serve.protocol import with_header_deadline

    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=10,
                            http=with_header_deadline(read_timeout))  # fmt: skip
    server = uvicorn.Server(config)  # off the main thread it installs no signal handlers
    quiet = CancelledStreams()
    logging.getLogger("uvicorn.error").addFilter(quiet)  # after Config, which sets uvicorn's logging up

    requested: list[int] = []  # the signals that asked for the stop
    failed: list[BaseException] = []  # what ended uvicorn, when it ended on its own

    def stop(sig: int, frame: FrameType | None) -> None:
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        requested.append(sig)
        if not server.should_exit:
            server.should_exit = True  # a requested stop exits 0
            threading.Thread(target=engine.shutdown, name="llmsample-stop").start()

    def http() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # uvicorn's sys.exit too: the main thread reports it
            failed.append(exc)
        finally:
            engine.shutdown()  # however uvicorn ended, the engine's loop ends with it

    previous = {sig: signal.signal(sig, stop) for sig in ENDING_SIGNALS}  # SIGHUP too: the terminal went away
    thread = threading.Thread(target=http, name="llmsample-http")
    try:
        ready()
        thread.start()
        engine.run()
    finally:
        server.should_exit = True  # the loop ended (shutdown, or a failure of its own): so does the HTTP side
        engine.shutdown()
        if thread.ident is not None:
            thread.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        logging.getLogger("uvicorn.error").removeFilter(quiet)
        sys.stderr.flush()
    if not requested:
        ended = failed[0] if failed else None  # uvicorn logs why it could not start, then returns or exits
        reason = (
            first_line(ended) if ended and not isinstance(ended, SystemExit) else "uvicorn could not go on (see above)"
        )
        raise RuntimeFailure(f"the HTTP server stopped on its own: {reason}")
