"""HTTP to an engine with the standard library alone (``http.client``: importing httpx would cost
the start-up this package exists to save): over the engine's Unix socket, or to any
``llmsample serve`` by URL. A job's answer is a stream of JSON lines (:mod:`llmsample.client.wire`)."""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llmsample import __version__
from llmsample.client.wire import (
    DETERMINISTIC_HEADER,
    DROPPED_HEADER,
    JOB_PATH,
    VERSION_HEADER,
    Failed,
    Job,
    decode,
    served,
)
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import Summary, TokenEvent

WAIT_CAP_S = 1.0
"""A busy engine's ``Retry-After`` is how long an answer takes; a row may free sooner: ask again
at least this often."""


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

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        if self.where.startswith("unix:"):
            return UnixConnection(self.where.removeprefix("unix:"), timeout)
        url = urllib.parse.urlsplit(self.where)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise UserError(f"--host {self.where!r}: expected a URL such as http://HOST:PORT")
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        return kind(url.hostname, url.port, timeout=timeout)

    def headers(self) -> dict[str, str]:
        headers = {VERSION_HEADER: __version__, "Content-Type": "application/json"}
        if self.deterministic:
            headers[DETERMINISTIC_HEADER] = "1"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def get_json(target: Target, path: str, timeout: float = 5.0) -> Any:
    """A GET answered with JSON; unreachable or failing is :class:`RuntimeFailure`."""
    connection = target.connection(timeout)
    try:
        connection.request("GET", path, headers=target.headers())
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise RuntimeFailure(f"cannot reach the engine at {target.where} ({_reason(exc)})") from None
    finally:
        connection.close()
    if response.status != 200:
        raise _refusal(target, response.status, body)
    return json.loads(body)


def post_json(target: Target, path: str, body: dict[str, Any]) -> Any:
    """A POST answered with JSON (``explain``'s); a refusal is the in-process run's error, an
    engine that cannot be reached or breaks off is :class:`EngineGone`."""
    connection = target.connection()
    try:
        connection.request("POST", path, json.dumps(body, allow_nan=False), target.headers())
        response = connection.getresponse()
        answer = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise EngineGone(f"cannot reach the engine at {target.where} ({_reason(exc)})") from None
    finally:
        connection.close()
    if response.status != 200:
        raise _refusal(target, response.status, answer)
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


def stream_rows(
    target: Target, jobs: list[Job], waiting: Callable[[str], None]
) -> Iterator[tuple[int, TokenEvent | Summary | Failed]]:
    """Several jobs as rows of the engine's one batch: every one sent before any is read, then
    each one's records in turn as ``(index, record)``; a row that failed ends with its
    :class:`Failed`, and the others go on."""
    opened = [_admitted(target, job, waiting) for job in jobs]
    streams = [_records(target, *pair) for pair in opened]
    try:
        for index, stream in enumerate(streams):
            for record in stream:
                yield index, record
    finally:
        for stream in streams:
            stream.close()
        for connection, _ in opened:
            connection.close()


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
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise EngineGone(f"cannot reach the engine at {target.where} ({_reason(exc)})") from None
        if response.status == 200:
            return connection, response
        answer = response.read()
        connection.close()
        if response.status != 503 or _code(answer) != "server_busy":
            raise _refusal(target, response.status, answer)
        if not told:
            waiting(f"the engine at {target.where} is busy; waiting for a free row (--local runs here instead)")
            told = True
        time.sleep(min(float(response.headers.get("Retry-After") or 1), WAIT_CAP_S))


def _code(body: bytes) -> str | None:
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _refusal(target: Target, status: int, body: bytes) -> Exception:
    """The engine's answer as the in-process run's error: a bad request is the user's (exit 2)."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace").strip()[:200] or f"HTTP {status}"
    if status in (400, 401, 404, 409):
        return UserError(message)
    if status == 422 and _code(body) == "run_failed":  # the run itself failed there, as it would here
        return RuntimeFailure(message)
    return RuntimeFailure(f"the engine at {target.where} answered {status}: {message}")


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def say(line: str) -> None:
    """One line on stderr, as the CLI's own notices are."""
    print(f"llmsample: {line}", file=sys.stderr, flush=True)
