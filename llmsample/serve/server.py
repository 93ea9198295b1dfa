"""Running the app: uvicorn on a socket bound here (so ``--port 0`` reports the port it got), the
engine's thread beside it, and SIGTERM as a clean ending: no new connections, every in-flight
row cancelled so its stream ends with a final chunk and ``[DONE]``, then exit 0."""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType

from llmsample.errors import UserError

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


def serve_forever(app: object, sock: socket.socket, on_stop: Callable[[], None], log_level: str = "warning") -> None:
    """Serve until SIGTERM or Ctrl-C; ``on_stop`` (the engine's shutdown) runs on the first one."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                try:
                    asyncio.get_running_loop().call_soon_threadsafe(on_stop)
                except RuntimeError:
                    on_stop()
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True  # not re-raised afterwards: a requested stop exits 0

    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=10)
    server = Server(config)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.stderr.flush()
