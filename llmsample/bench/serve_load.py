"""``llmsample bench --serve``: the server under load against ``llmsample batch`` on the same
prompts at the same batch size, each in a process of its own, side by side in rotating rounds
(:mod:`llmsample.bench.timing`), ratios of rounds.

- ``batch``: ``llmsample batch`` over the completions bodies as its lines (raw prompts, as
  ``/v1/completions`` sends them), timed by its records: its decode time is the longest
  request's ``elapsed_s``, so the model's loading is counted on neither side.
- ``serve``: one ``llmsample serve`` (warmed by a request first), ``clients`` streaming clients
  (coroutines on one event loop, :mod:`llmsample.bench.served`) pulling the same bodies from one
  queue, set off together: aggregate tokens/s over the wall time from the first request to the
  last answer, and p50/p95 of the time to the first text and of each request's latency.

Both decode greedily with ``min_tokens`` = ``max_tokens``, so every request is that long."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from llmsample.bench.served import ModelArgs, Streamed, running_server, stream
from llmsample.errors import RuntimeFailure


@dataclass(frozen=True)
class Side:
    """One round of one side: tokens, seconds, tokens/s, and the rate once every row decodes."""

    tokens: int
    wall_s: float
    tok_s: float
    decode_tok_s: float
    ttft_s: dict[str, float] | None = None  # p50, p95 (the server's side)
    latency_s: dict[str, float] | None = None


@dataclass(frozen=True)
class ServeLoad:
    """Every round's two sides, and the medians of the rounds' ratios (serve over batch)."""

    clients: int
    requests: int
    tokens: int
    batch: list[Side]
    serve: list[Side]

    @property
    def ratio(self) -> float:
        return statistics.median(s.tok_s / b.tok_s for s, b in zip(self.serve, self.batch, strict=True))

    @property
    def decode_ratio(self) -> float:
        return statistics.median(s.decode_tok_s / b.decode_tok_s for s, b in zip(self.serve, self.batch, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {"clients": self.clients, "requests": self.requests, "new_tokens": self.tokens,
                "rounds": [{"batch": asdict(b), "serve": asdict(s)} for b, s in zip(self.batch, self.serve, strict=True)],
                "ratio_median": self.ratio, "decode_ratio_median": self.decode_ratio}  # fmt: skip


def bodies(count: int, tokens: int) -> list[dict[str, Any]]:
    """``count`` greedy completions of the benchmarks' chat prompts, each exactly ``tokens`` long."""
    from llmsample.bench.prompts import batch_prompts

    prompts = batch_prompts(count)
    return [{"prompt": prompts[i % len(prompts)], "max_tokens": tokens, "min_tokens": tokens, "temperature": 0,
             "seed": 0} for i in range(count)]  # fmt: skip


def decode_rate(spans: list[tuple[float, float, int]]) -> float:
    """Tokens after the first over the longest time from a first token to an end, the same on
    both sides: a fresh ``llmsample batch`` pays its first pass's one-time set-up (seconds on a
    CPU) before its first token, where the server was warmed before the clock started."""
    return sum(tokens - 1 for _, _, tokens in spans) / max(max(end - first for first, end, _ in spans), 1e-9)


def through_batch(args: ModelArgs, clients: int, work: list[dict[str, Any]]) -> Side:
    """``llmsample batch`` on the bodies, at ``clients`` rows, in a process of its own."""
    lines = "\n".join(json.dumps({**body, "raw": True}) for body in work)
    command = [sys.executable, "-m", "llmsample", "batch", *args.flags(), "--batch-size", str(clients),
               "--tokens", "none", "-q", "--no-log"]  # fmt: skip
    done = subprocess.run(command, input=lines, capture_output=True, text=True)
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeFailure(f"the benchmark's llmsample batch exited {done.returncode}: {last[0].strip()}")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    tokens = sum(record["tokens"] for record in records)
    wall = max(record["elapsed_s"] for record in records)
    spans = [(record["ttft_s"], record["elapsed_s"], record["tokens"]) for record in records]
    return Side(tokens, wall, tokens / wall, decode_rate(spans))


def through_server(url: str, clients: int, work: list[dict[str, Any]]) -> Side:
    """``clients`` coroutines on one event loop, pulling the bodies from one queue."""
    import asyncio
    import time

    done: list[Streamed] = []

    async def everyone() -> float:
        todo: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for body in work:
            todo.put_nowait(body)

        async def client() -> None:
            while not todo.empty():
                done.append(await stream(url, "/v1/completions", todo.get_nowait()))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - started

    wall = asyncio.run(everyone())
    spans = [(s.first_s, s.end_s, s.usage["completion_tokens"]) for s in done]
    tokens = sum(span[2] for span in spans)
    return Side(tokens, wall, tokens / wall, decode_rate(spans),
                percentiles([s.first_s for s in done]), percentiles([s.end_s for s in done]))  # fmt: skip


def percentiles(values: list[float]) -> dict[str, float]:
    p95 = statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]
    return {"p50": statistics.median(values), "p95": p95}


def run_serve_benchmark(
    args: ModelArgs, clients: int, requests: int, runs: int, tokens: int, log: Callable[[str], None]
) -> ServeLoad:
    """``runs`` rounds of both sides; one server for all of them."""
    import asyncio

    from llmsample.bench.timing import rounds

    work = bodies(requests, tokens)
    log(f"starting llmsample serve --batch-size {clients}")
    with running_server(args, "--batch-size", str(clients)) as url:
        asyncio.run(stream(url, "/v1/completions", {**work[0], "max_tokens": 2, "min_tokens": 2}))  # warm-up
        log(f"{requests} requests of {tokens} tokens, {clients} at once: llmsample batch and the server, {runs} rounds")
        batch, serve = rounds(runs, [lambda: through_batch(args, clients, work),
                                     lambda: through_server(url, clients, work)])  # fmt: skip
    return ServeLoad(clients, requests, tokens, batch, serve)


def table(result: ServeLoad) -> str:
    """The figures as lines for the terminal."""
    tok_s = [f"{s.tok_s:.1f}/{b.tok_s:.1f}" for s, b in zip(result.serve, result.batch, strict=True)]
    first = [side.ttft_s for side in result.serve if side.ttft_s]
    ends = [side.latency_s for side in result.serve if side.latency_s]
    return "\n".join([
        f"llmsample serve against llmsample batch: {result.requests} requests of {result.tokens} tokens, "
        f"{result.clients} at once, median of {len(result.serve)} rounds",
        f"  served / batch tok/s by round  {', '.join(tok_s)}",
        f"  ratio (median of the rounds)   {result.ratio:.3f}x",
        f"  after the first token          {result.decode_ratio:.3f}x",
        f"  time to first token p50, p95   {_span(first, 'p50')} s, {_span(first, 'p95')} s",
        f"  latency p50, p95               {_span(ends, 'p50')} s, {_span(ends, 'p95')} s",
    ])  # fmt: skip


def _span(figures: list[dict[str, float]], key: str) -> str:
    low, high = min(f[key] for f in figures), max(f[key] for f in figures)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"
