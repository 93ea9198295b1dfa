"""HTTP to an engine with the standard library alone (``http.client``: importing httpx would cost
the start-up this package exists to save): over the engine's Unix socket, or to any
``llmsample serve`` by URL. A job's answer is a stream of JSON lines (:mod:`llmsample.client.wire`)."""

from __future__ import annotations

import http.client
import json
import select
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llmsample.client.wire import (
    DETERMINISTIC_HEADER,
    DROPPED_HEADER,
    ENGINE_PATH,
    JOB_PATH,
    VERSION_HEADER,
    Failed,
    decode,
    served,
)
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import Summary, TokenEvent
from llmsample.jobs import Job
from llmsample.version import __version__

WAIT_CAP_S = 1.0
"""A busy engine's ``Retry-After`` is how long an answer takes; a row may free sooner: ask again
at least this often."""


SILENCE_S = 15.0
"""A client waits for its engine's answer without a limit (a long queue, a long prefill), but
says once when none has come for this long: a stopped engine looks just like a slow one."""


class EngineGone(RuntimeFailure):
    """The engine cannot be reached, or its answer broke off: it died, or was stopped."""


class UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix socket."""

    def __init__(self, path: str, timeout: float | None = None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass(frozen=True)
class Target:
    """An engine: ``unix:PATH`` (one of ``llmsample start``'s) or an ``http(s)://`` URL."""

    where: str
    api_key: str | None = None
    name: str | None = None  # the model it serves, when known before asking
    deterministic: bool = False  # the command asked for --deterministic: the engine must compute rows alone
    keep_alive_s: float | None = None  # one of this user's engines: its keep-alive (None: never)

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        if self.where.startswith("unix:"):
            return UnixConnection(self.where.removeprefix("unix:"), timeout)
        scheme, host, port = address(self.where)
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        return kind(host, port, timeout=timeout)

    def headers(self) -> dict[str, str]:
        headers = {VERSION_HEADER: __version__, "Content-Type": "application/json"}
        if self.deterministic:
            headers[DETERMINISTIC_HEADER] = "1"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def address(url: str) -> tuple[str, str, int]:
    """A server's URL as (scheme, host, port); ``ValueError`` saying what is wrong with it (urllib
    finds a port out of range or not a number only when asked for it)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unclosed or misplaced bracket
        raise ValueError("its brackets are not an IPv6 address's (http://[::1]:8000)") from None
    try:
        port = parts.port
    except ValueError:
        text = parts.netloc.rpartition(":")[2]
        if text.isdigit() and int(text) <= 65535:  # a bare IPv6 address: its colons read as a port's
            raise ValueError("an IPv6 address goes in brackets (http://[::1]:8000)") from None
        raise ValueError(f"its port {text!r} is not a number from 0 to 65535") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("it does not start with http:// or https://")
    if not parts.hostname:
        raise ValueError("it names no host")
    # the scheme's port said, since http.client reads an IPv6 address's last group as a port
    return parts.scheme, parts.hostname, port if port is not None else (443 if parts.scheme == "https" else 80)


def get_json(target: Target, path: str, timeout: float = 5.0) -> Any:
    """A GET answered with JSON; unreachable or failing is :class:`RuntimeFailure`, a server
    that is not llmsample's one line for the user (:func:`_foreign`)."""
    connection = target.connection(timeout)
    try:
        connection.request("GET", path, headers=target.headers())
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(target, exc, RuntimeFailure) from None
    finally:
        connection.close()
    if response.status != 200:
        raise _refusal(target, response.status, body, response.getheader("Content-Type"))
    try:
        return json.loads(body)
    except ValueError:
        raise _foreign(target, 200, response.getheader("Content-Type")) from None


def engine_status(target: Target, timeout: float = 5.0) -> dict[str, Any]:
    """The engine's status (model, rows, context...); a server whose answer is not one, whatever
    it serves, is one line for the user."""
    status = get_json(target, ENGINE_PATH, timeout)
    if not (isinstance(status, dict) and isinstance(status.get("model"), str) and "version" in status):
        raise _foreign(target, 200, "JSON that is not an engine's status")
    return status


def post_json(target: Target, path: str, body: dict[str, Any]) -> Any:
    """A POST answered with JSON (``explain``'s); a refusal is the in-process run's error, an
    engine that cannot be reached or breaks off is :class:`EngineGone`."""
    connection = target.connection()
    try:
        connection.request("POST", path, json.dumps(body, allow_nan=False), target.headers())
        response = connection.getresponse()
        answer = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(target, exc, EngineGone) from None
    finally:
        connection.close()
    kind = response.getheader("Content-Type")
    if response.status != 200:
        raise _refusal(target, response.status, answer, kind)
    if not (kind or "").startswith("application/json"):
        raise _foreign(target, 200, kind)
    try:
        return json.loads(answer)
    except ValueError:
        raise EngineGone(f"the engine at {target.where} went away mid-answer") from None


def stream_job(target: Target, job: Job, waiting: Callable[[str], None]) -> Iterator[TokenEvent | Summary]:
    """The job's records as the engine decodes them, its summary last (saying where it ran).
    ``waiting`` is told once, in one line, when the engine is full and the job waits for a row;
    a row the engine could not finish raises as the in-process run would."""
    yield from _raising(_records(target, *_admitted(target, job, waiting)))


def chat_job(
    target: Target, job: Job, waiting: Callable[[str], None]
) -> tuple[Iterator[TokenEvent | Summary], int]:
    """A chat's reply, its row admitted before this returns: its records (as :func:`stream_job`'s),
    and how many of the conversation's oldest exchanges the engine dropped to fit its context
    (``job.fit_room``)."""
    connection, response = _admitted(target, job, waiting)
    return _raising(_records(target, connection, response)), int(response.getheader(DROPPED_HEADER) or 0)


def _raising(records: Iterator[TokenEvent | Summary | Failed]) -> Iterator[TokenEvent | Summary]:
    """A row the engine could not finish raises as the in-process run would."""
    try:
        for record in records:
            if isinstance(record, Failed):
                raise (UserError if record.user_error else RuntimeFailure)(record.message)
            yield record
    finally:
        records.close()  # a Ctrl-C: the connection closes, and the engine cancels the row


def job_records(target: Target, job: Job, waiting: Callable[[str], None]) -> Iterator[TokenEvent | Summary | Failed]:
    """One job's records, its row admitted before this returns (a refusal raises here): the
    tokens, then its summary or its :class:`Failed`; the engine gone mid-answer raises."""
    return _records(target, *_admitted(target, job, waiting))


def _records(
    target: Target, connection: http.client.HTTPConnection, response: http.client.HTTPResponse
) -> Iterator[TokenEvent | Summary | Failed]:
    ended = False
    try:
        for line in response:
            record = decode(line)
            if isinstance(record, Summary):
                ended = True
                yield served(record, target.where)
                return
            yield record
            if isinstance(record, Failed):
                return
    except (OSError, http.client.HTTPException, ValueError):
        pass  # the stream broke off: said below, in one line
    finally:
        connection.close()
    if not ended:
        raise EngineGone(f"the engine at {target.where} went away mid-answer")


def _admitted(
    target: Target, job: Job, waiting: Callable[[str], None]
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    body = json.dumps(job.to_json(), allow_nan=False)
    told = False
    while True:
        connection = target.connection()
        try:
            connection.request("POST", JOB_PATH, body, target.headers())
            _await(connection, target, waiting)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise _unreachable(target, exc, EngineGone) from None
        kind = response.getheader("Content-Type")
        if response.status == 200 and (kind or "").startswith("application/x-ndjson"):
            return connection, response
        answer = response.read()
        connection.close()
        if response.status == 200:
            raise _foreign(target, 200, kind)
        if response.status != 503 or _code(answer) != "server_busy":
            raise _refusal(target, response.status, answer, kind)
        if not told:
            waiting(f"the engine at {target.where} is busy; waiting for a free row (--local runs here instead)")
            told = True
        time.sleep(min(float(response.headers.get("Retry-After") or 1), WAIT_CAP_S))


def _await(connection: http.client.HTTPConnection, target: Target, waiting: Callable[[str], None]) -> None:
    """Until the answer starts; one line when it has not come for :data:`SILENCE_S` seconds,
    naming a stopped engine of this user's and the way to resume it."""
    if connection.sock is None or select.select([connection.sock], [], [], SILENCE_S)[0]:
        return
    from llmsample.client import registry

    mine = target.where.startswith("unix:")  # one of this user's engines: its process can be looked at
    record = next((r for r in registry.engines() if r.where == target.where), None) if mine else None
    if record is not None and registry.stopped(record.pid):
        waiting(f"the engine for {record.name} (pid {record.pid}) is stopped (SIGSTOP, Ctrl-Z or a debugger): "
                f"`kill -CONT {record.pid}` resumes it, `llmsample stop` ends it; waiting for it (Ctrl-C stops)")  # fmt: skip
    else:
        waiting(f"no answer from the engine at {target.where} for {SILENCE_S:g} s; waiting for it (Ctrl-C stops)")


def _code(body: bytes) -> str | None:
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _refusal(target: Target, status: int, body: bytes, kind: str | None) -> Exception:
    """The engine's answer as the in-process run's error: a bad request is the user's (exit 2).
    An answer without llmsample's error object, or a 404 or 405 for a path of llmsample's own
    (another server's, or another version's), is not an engine's: one line for the user, never its
    body."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = None
    if not isinstance(message, str) or status == 405 or (status == 404 and _code(body) != "model_not_found"):
        return _foreign(target, status, kind)
    message = _printable(message)
    if status in (400, 401, 404, 409):
        return UserError(message)
    if status == 422 and _code(body) == "run_failed":  # the run itself failed there, as it would here
        return RuntimeFailure(message)
    return RuntimeFailure(f"the engine at {target.where} answered {status}: {message}")


NOT_HTTP = (http.client.BadStatusLine, http.client.LineTooLong, http.client.UnknownProtocol)
"""What ``http.client`` raises for an answer that is not HTTP (``RemoteDisconnected``, a
``BadStatusLine`` too, is a server that closed the connection without an answer)."""


def _unreachable(target: Target, exc: BaseException, kind: type[RuntimeFailure]) -> Exception:
    """A request that got no HTTP answer: a server that answers something else is the user's to
    fix; one that is gone, refuses or closes is ``kind`` (exit 1)."""
    if isinstance(exc, NOT_HTTP) and not isinstance(exc, http.client.RemoteDisconnected):
        return _foreign(target, None, None)
    return kind(f"cannot reach the engine at {target.where} ({_reason(exc)})")


def _foreign(target: Target, status: int | None, kind: str | None) -> UserError:
    """A server that is not ``llmsample serve`` (a web server, another API): what it answered in a
    few words, never its page."""
    answered = "an answer that is not HTTP"
    if status is not None:
        answered = f"HTTP {status}, {_printable(kind or 'no content type', 60)}"
    return UserError(f"{target.where} does not answer as llmsample serve does ({answered}); point --host or "
                     "LLMSAMPLE_HOST at an llmsample serve (http://HOST:PORT), or pass --local")  # fmt: skip


def _printable(text: str, limit: int | None = None) -> str:
    """A server's words on one line: control characters escaped (a terminal's escape codes, a
    newline), cut at ``limit`` characters when given."""
    flat = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


def _reason(exc: BaseException) -> str:
    return _printable(getattr(exc, "strerror", None) or str(exc) or type(exc).__name__)


def say(line: str) -> None:
    """One line on stderr, as the CLI's own notices are."""
    print(f"llmsample: {line}", file=sys.stderr, flush=True)
