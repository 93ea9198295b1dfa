"""A ``llmsample serve`` process for the benchmarks that time the server (``--serve``,
``--multi-turn``), and the lean streaming client they time it with.

The client speaks raw HTTP/1.1, one connection a request (``Connection: close``: the body ends at
EOF): the clients share the cores with the server, and an httpx client took 1-1.7 ms of CPU per
streamed chunk, a sixth of a core under load, which the server's forward passes lost."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsample.errors import RuntimeFailure


@dataclass(frozen=True)
class ModelArgs:
    """The model flags every process of a benchmark runs with (the bench's own)."""

    model: str | None
    device: str
    dtype: str
    backend: str

    def flags(self) -> list[str]:
        return ["--device", self.device, "--dtype", self.dtype, "--backend", self.backend,
                *(["-m", self.model] if self.model else [])]  # fmt: skip


@dataclass(frozen=True)
class Streamed:
    """One streamed answer: seconds to its first text and to its end, its ``usage``, and the
    bytes it came in (its text is read from them only when asked: not while others stream)."""

    first_s: float
    end_s: float
    usage: dict[str, Any]
    data: bytes

    @property
    def text(self) -> str:
        return "".join(text_of(line) for line in self.data.split(b"\n"))


@contextmanager
def running_server(args: ModelArgs, *extra: str) -> Iterator[str]:
    """``llmsample serve`` on a free port with ``extra`` flags, its URL once it listens; ended
    (and waited for) on the way out. A server that exits first is one line: its last words."""
    with tempfile.TemporaryDirectory(prefix="ls-bench-serve-") as folder:
        log = Path(folder) / "serve.log"
        command = [sys.executable, "-m", "llmsample", "serve", "--port", "0", "--no-log", *args.flags(), *extra]
        with open(log, "wb") as err:
            proc = subprocess.Popen(command, stderr=err, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            yield _listening(proc, log)
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """A server process ended and waited for: asked to stop, killed after a minute."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _listening(proc: subprocess.Popen[bytes], log: Path) -> str:
    while True:
        text = log.read_text(errors="replace")
        found = re.search(r"on (http://[^ ]+)/v1", text)
        if found:
            return found.group(1)
        if proc.poll() is not None:
            last = [line for line in text.splitlines() if line.strip()][-1:] or ["no output"]
            raise RuntimeFailure(f"the benchmark's server exited {proc.returncode}: {last[0].strip()}")
        time.sleep(0.2)


async def stream(url: str, path: str, body: dict[str, Any]) -> Streamed:
    """``body`` streamed to ``path`` (``/v1/completions`` or ``/v1/chat/completions``) with the
    usage chunk asked for; parsed only until the first text, then once at the end."""
    import asyncio

    host, port = url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + payload)
    first, data, scanned = None, bytearray(), 0
    while chunk := await reader.read(1 << 16):
        data += chunk
        if first is None:
            lines = data[scanned:].split(b"\n")
            scanned = len(data) - len(lines[-1])
            if any(text_of(line) for line in lines[:-1]):
                first = time.perf_counter() - sent
    end = time.perf_counter() - sent
    writer.close()
    return Streamed(first or 0.0, end, _usage(bytes(data)), bytes(data))


def _usage(data: bytes) -> dict[str, Any]:
    """The stream's usage chunk; for a finished stream without one (llama-cpp-python's server
    ignores ``stream_options``), its chunks before the finishing one, one a token."""
    lines = data.split(b"\n")
    failed = next((line for line in lines if line.startswith(b'data: {"error"')), None)
    if failed is not None:  # a row that failed mid-stream: its usage counts none of its tokens
        raise RuntimeFailure(f"the benchmark's server failed a request: {json.loads(failed[6:])['error']['message']}")
    for line in reversed(lines):
        if line.startswith(b"data: {") and b'"usage": {' in line:
            return json.loads(line[6:])["usage"]
    if b"data: [DONE]" in data:
        return {"completion_tokens": sum(1 for line in lines if _unfinished(line))}
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        why = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        why = head.split(b"\r\n", 1)[0].decode(errors="replace")
    raise RuntimeFailure(f"the benchmark's server answered without a usage chunk: {why}")


def text_of(line: bytes) -> str:
    """A streamed chunk's text, a completion's or a chat delta's ("" for any other line)."""
    if not line.startswith(b"data: {"):
        return ""
    choices = json.loads(line[6:]).get("choices")
    if not choices:
        return ""
    return choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or ""


def _unfinished(line: bytes) -> bool:
    """A chunk that carries a token: a choice whose ``finish_reason`` is still null."""
    if not line.startswith(b"data: {"):
        return False
    choices = json.loads(line[6:]).get("choices")
    return bool(choices) and choices[0].get("finish_reason") is None
