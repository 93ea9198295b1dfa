"""The server under load against ``llmsample batch`` on the same prompts at the same batch size.

``batch``: ``llmsample batch`` over the same prompts in its own process, timed by its records
(the model's loading left out). ``serve``: ``llmsample serve`` in a subprocess, ``--clients``
concurrent streaming clients pulling the same prompts from one queue; aggregate tokens/s over the
wall time from the first request to the last answer, time to first token (the first chunk
carrying text) and per-request latency, p50 and p95. Both sides decode greedily with
``min_tokens`` = ``max_tokens``, so every request generates exactly that many tokens.

    PYTHONPATH=. python bench/serve_load.py --batch-size 16 --clients 16 --requests 32 --max-tokens 64

Prints one JSON document (``--out FILE`` also writes it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def bodies(count: int, tokens: int) -> list[dict[str, Any]]:
    from llmsample.bench.prompts import batch_prompts

    prompts = batch_prompts(count)
    return [{"prompt": prompts[i % len(prompts)], "max_tokens": tokens, "min_tokens": tokens, "temperature": 0,
             "seed": 0} for i in range(count)]  # fmt: skip


def through_batch(args: argparse.Namespace, work: list[dict[str, Any]]) -> dict[str, float]:
    """``llmsample batch`` on the completions bodies as its lines (raw prompts, as /v1/completions
    sends them), in its own process like the server. Its decode time is the longest request's
    ``elapsed_s`` (with --requests at most --batch-size every request starts at once), so the
    model's loading is not counted on either side."""
    lines = "\n".join(json.dumps({**body, "raw": True}) for body in work)
    command = [sys.executable, "-m", "llmsample", "batch", "--device", args.device, "--dtype", args.dtype,
               "--batch-size", str(args.batch_size), "--tokens", "none", "-q",
               *(["-m", args.model] if args.model else [])]  # fmt: skip
    done = subprocess.run(command, input=lines, capture_output=True, text=True, check=True)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    tokens = sum(record["tokens"] for record in records)
    wall = max(record["elapsed_s"] for record in records)
    spans = [(record["ttft_s"], record["elapsed_s"], record["tokens"]) for record in records]
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "decode_tok_s": decode_rate(spans)}


def decode_rate(spans: list[tuple[float, float, int]]) -> float:
    """Tokens after the first, over the longest time from a first token to an end: the rate once
    every row decodes, the same on both sides. A fresh ``llmsample batch`` process pays its first
    forward pass's one-time set-up (seconds on a CPU) before its first token, while the server was
    warmed before the clock started; the wall-clock ratio counts that against batch alone."""
    return sum(tokens - 1 for _, _, tokens in spans) / max(end - first for first, end, _ in spans)


def start_server(args: argparse.Namespace, log: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """``llmsample serve`` on a free port with ``extra`` flags; its URL once it listens."""
    command = [sys.executable, "-m", "llmsample", "serve", "--port", "0", "--device", args.device, "--dtype",
               args.dtype, "--batch-size", str(args.batch_size), *(["-m", args.model] if args.model else []),
               *extra]  # fmt: skip
    with open(log, "wb") as err:
        proc = subprocess.Popen(command, stderr=err, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    while True:
        found = re.search(r"on (http://[^ ]+)/v1", log.read_text(errors="replace"))
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"the server exited {proc.returncode}: {log.read_text(errors='replace')}")
        time.sleep(0.2)


async def one_stream(url: str, body: dict[str, Any]) -> tuple[float, float, int]:
    """Seconds to the first text chunk, to the end, and the tokens (from the usage chunk). Raw
    HTTP/1.1 on one connection per request (``Connection: close``: the body ends at EOF): the
    clients share the 2 cores with the server, and an httpx client took 1-1.7 ms of CPU per
    streamed chunk, a sixth of a core under load, which the server's forward passes lost."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip
    sent = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + payload)
    first, data, scanned = None, bytearray(), 0
    while chunk := await reader.read(1 << 16):
        data += chunk
        if first is None:  # parsed only until the first text
            lines = data[scanned:].split(b"\n")
            scanned = len(data) - len(lines[-1])
            if any(text_of(line) for line in lines[:-1]):
                first = time.perf_counter() - sent
    end = time.perf_counter() - sent
    writer.close()
    usage = next(line for line in reversed(data.split(b"\n")) if line.startswith(b"data: {") and b'"usage": {' in line)
    tokens = json.loads(usage[6:])["usage"]["completion_tokens"]
    return first or 0.0, end, tokens


def text_of(line: bytes) -> str:
    """A streamed completion chunk's text ("" for any other line)."""
    if not line.startswith(b"data: {"):
        return ""
    choices = json.loads(line[6:]).get("choices")
    return choices[0]["text"] if choices else ""


def through_server(url: str, args: argparse.Namespace, work: list[dict[str, Any]]) -> dict[str, Any]:
    """``--clients`` coroutines on one event loop in one thread, pulling bodies from one queue, set
    off together."""
    results: list[tuple[float, float, int]] = []

    async def clients() -> float:
        todo: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for body in work:
            todo.put_nowait(body)

        async def client_loop() -> None:
            while not todo.empty():
                results.append(await one_stream(url, todo.get_nowait()))

        started = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(args.clients)))
        return time.perf_counter() - started

    wall = asyncio.run(clients())
    tokens = sum(r[2] for r in results)
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "decode_tok_s": decode_rate(results),
            "requests": len(results),
            "ttft_s": percentiles([r[0] for r in results]), "latency_s": percentiles([r[1] for r in results])}  # fmt: skip


def percentiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=20, method="inclusive")
    return {"p50": statistics.median(values), "p95": cuts[18]}


def main() -> None:
    from llmsample.bench.timing import rounds

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", "-m", default=None, help="[default: the default model]")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = bodies(args.requests, args.max_tokens)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-load-{os.getpid()}.log"
    proc, url = start_server(args, log)
    runs: list[dict[str, Any]] = []
    try:
        asyncio.run(one_stream(url, {**work[0], "max_tokens": 4, "min_tokens": 4}))  # a warm-up, not counted
        # rotating rounds, so a busy machine slows both sides of a round alike
        batches, served = rounds(
            args.runs, [lambda: through_batch(args, work), lambda: through_server(url, args, work)]
        )
        runs = [{"batch": b, "serve": s} for b, s in zip(batches, served, strict=True)]
    finally:
        proc.terminate()
        proc.wait(60)
    ratios = [run["serve"]["tok_s"] / run["batch"]["tok_s"] for run in runs]
    decode = [run["serve"]["decode_tok_s"] / run["batch"]["decode_tok_s"] for run in runs]
    document = {"settings": vars(args) | {"out": str(args.out) if args.out else None}, "runs": runs,
                "ratio_median": statistics.median(ratios), "ratios": ratios,
                "decode_ratio_median": statistics.median(decode), "decode_ratios": decode}  # fmt: skip
    text = json.dumps(document, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
