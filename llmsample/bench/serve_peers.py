"""``llmsample bench --serve-peers``: our server against its peers on the same GGUF and threads,
under 1, 4 and 16 concurrent streaming clients:

- ``llmsample serve`` on llama.cpp, ``--batch-size`` = clients, ``--max-model-len``
  :data:`PER_SLOT` (llama-server's positions per slot), every token's full record streamed
  (``"llmsample": {"tokens": "full"}``: the 20 alternatives, each stage's figures);
- llama.cpp's ``llama-server`` (:mod:`llmsample.bench.llama_server`), ``-np`` = clients slots
  of :data:`PER_SLOT` positions, flash attention off as our backend has it (its ``-fa auto``
  turns it on for a CPU), continuous batching and its prompt cache as it ships;
- llama-cpp-python's ``llama_cpp.server``, which answers one request at a time; told not to
  cut the streaming request short when the next arrives (its ``interrupt_requests`` default), so
  the others wait in line and every answer is whole.

Each side's requests are the same ``/v1/completions`` bodies (``--serve``'s: greedy, exactly
``tokens`` long through ``min_tokens`` and ``ignore_eos``), timed by :mod:`llmsample.bench.served`'s
lean client, whose raw HTTP costs the server's cores less than the ``openai`` client's httpx
does (its docstring has the figures). The real ``openai`` client sends each server's warm-up
request, so every side is one that client can talk to. Sides run in rotating rounds
(:mod:`llmsample.bench.timing`); ratios are the medians of the rounds' own. A side that cannot run
here (no compiler for llama-server, no FastAPI for llama_cpp.server) is one line and left out."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmsample.bench.llama_server import Unavailable, ensure_llama_server, server_command, wait_ready
from llmsample.bench.prompts import distinct_prompts
from llmsample.bench.serve_load import Side, bodies, through_server
from llmsample.bench.served import ModelArgs, running_server, stop, stream
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.errors import RuntimeFailure

CLIENTS = (1, 4, 16)
PER_SLOT = 512  # llama-server's positions per slot: a bench prompt (< 80 tokens) and 64 new ones, with room
OURS, LLAMA_SERVER, LLAMA_CPP_PYTHON = "llmsample serve", "llama-server", "llama_cpp.server"
SERVER_EXTRAS = ("fastapi", "uvicorn", "sse_starlette", "pydantic_settings", "starlette_context")
TARGETS = {"tok/s": 1.0, "TTFT p50": 1.2, "TTFT p95": 1.2}  # ours / llama-server, from issue 59


@dataclass(frozen=True)
class Peer:
    """A side: its name, the server it starts for ``clients`` at once (its URL while it runs),
    and the body keys its requests add."""

    name: str
    start: Callable[[int], AbstractContextManager[str]]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PeerLoad:
    """One client count: every side's rounds, and our forward passes' share of our rounds' time."""

    clients: int
    requests: int
    sides: dict[str, list[Side]]
    forward_share: list[float]
    failed: dict[str, str] = field(default_factory=dict)  # a side whose requests failed: none of its rounds kept

    def ratios(self) -> dict[str, float]:
        """Ours over each peer, medians of the rounds' ratios: aggregate tok/s, TTFT p50 and p95."""
        ours, found = self.sides.get(OURS), {}
        for peer in (LLAMA_SERVER, LLAMA_CPP_PYTHON):
            if ours is None or peer not in self.sides:
                continue
            theirs = self.sides[peer]
            found[f"tok/s ours / {peer}"] = paired_ratio([s.tok_s for s in ours], [s.tok_s for s in theirs])
            for key in ("p50", "p95"):
                found[f"TTFT {key} ours / {peer}"] = paired_ratio(_ttft(ours, key), _ttft(theirs, key))
        return found

    def to_dict(self) -> dict[str, Any]:
        return {"clients": self.clients, "requests": self.requests,
                "sides": {name: [asdict(s) for s in runs] for name, runs in self.sides.items()},
                "ours_forward_share": self.forward_share, "failed": self.failed, "ratios": self.ratios()}  # fmt: skip


@dataclass(frozen=True)
class ServePeers:
    """The whole run: what was served, with what, and each client count's figures."""

    gguf: str
    threads: int
    tokens: int
    runs: int
    loads: list[PeerLoad]
    skipped: dict[str, str]  # a side left out, and the one line that says why
    load_average: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load at the start and the end

    def to_dict(self) -> dict[str, Any]:
        return {"gguf": Path(self.gguf).name, "threads": self.threads, "new_tokens": self.tokens,
                "load_average": list(self.load_average),
                "per_slot": PER_SLOT, "skipped": self.skipped, "loads": [load.to_dict() for load in self.loads]}  # fmt: skip


def _ttft(sides: list[Side], key: str) -> list[float]:
    return [(side.ttft_s or {})[key] for side in sides]


def ours(args: ModelArgs, *flags: str) -> Peer:
    """Our server on llama.cpp with ``flags``, a request's positions llama-server's per slot,
    every token's full record streamed."""
    sized = ("--max-model-len", str(PER_SLOT))
    return Peer(OURS, lambda clients: running_server(args, "--batch-size", str(clients), *sized, *flags),
                {"llmsample": {"tokens": "full"}})  # fmt: skip


def served_gguf(model: str | None, gguf_type: str | None) -> tuple[Path, int]:
    """The GGUF our llama.cpp backend runs for ``model`` (the default model's F16 rewrite unless
    ``gguf_type``) and its threads, as a load finds them: the peers are given the same."""
    from llmsample.models.loading import load_model

    lm = load_model(model, "cpu", "auto", backend="llama.cpp", gguf_type=gguf_type)
    try:
        return Path(lm.model.path), lm.model.threads
    finally:
        lm.model.close()


def llama_server(binary: Path, gguf: Path, threads: int) -> Peer:
    """llama.cpp's server with ``clients`` slots."""

    def start(clients: int) -> AbstractContextManager[str]:
        return running_peer(server_command(binary, gguf, threads, clients, PER_SLOT * clients), "/health", LLAMA_SERVER)

    return Peer(LLAMA_SERVER, start)


def llama_cpp_python_server(gguf: Path, threads: int) -> Peer:
    """llama-cpp-python's server: one request at a time whatever the clients."""
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--n_ctx", "2048", "--flash_attn", "False", "--verbose", "False", "--interrupt_requests", "False",
               "--host", "127.0.0.1"]  # fmt: skip
    return Peer(LLAMA_CPP_PYTHON, lambda clients: running_peer(command, "/v1/models", LLAMA_CPP_PYTHON))


def missing_server_extras(find: Callable[[str], Any] = importlib.util.find_spec) -> str | None:
    """Why ``llama_cpp.server`` cannot start here, or None."""
    missing = [name for name in SERVER_EXTRAS if find(name) is None]
    if find("llama_cpp") is None:
        return "llama-cpp-python is not installed (make llamacpp)"
    if missing:
        return f"llama_cpp.server needs {', '.join(missing)}: pip install 'llama-cpp-python[server]'"
    return None


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_peer(command: list[str], ready: str, name: str) -> Iterator[str]:
    """``command`` with ``--port`` on a free port, its URL once ``ready`` answers 200; ended (and
    waited for) on the way out. One that exits or hangs first is one line: its last words."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="ls-bench-peer-") as folder:
        log = Path(folder) / "peer.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            try:
                wait_ready(url + ready, lambda: proc.poll() is None)
            except RuntimeError as exc:
                lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
                raise RuntimeFailure(f"{name} {exc}: {(lines or ['no output'])[-1].strip()}") from exc
            yield url
        finally:
            stop(proc)


def warm_up(url: str, body: dict[str, Any]) -> None:
    """A two-token request through the real ``openai`` client (raw HTTP without it): the server
    speaks that client's API, and the clock then starts on a warm server."""
    short = {**body, "max_tokens": 2, "min_tokens": 2}
    try:
        from openai import OpenAI
    except ImportError:
        asyncio.run(stream(url, "/v1/completions", short))
        return
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
    known = ("prompt", "max_tokens", "temperature", "seed")
    extra = {key: value for key, value in short.items() if key not in known}
    chunks = client.completions.create(
        model=client.models.list().data[0].id, stream=True, extra_body=extra, **{k: short[k] for k in known}
    )
    if not "".join(chunk.choices[0].text for chunk in chunks if chunk.choices):
        raise RuntimeFailure(f"{url} streamed no text to the openai client")


def forward_seconds(url: str) -> float:
    """Our server's seconds in forward passes since it started (its ``/metrics``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("llmsample_forward_pass_seconds_sum"):
                return float(line.split()[-1])
    return float("nan")


def one_count(peers: list[Peer], clients: int, requests: int, runs: int, tokens: int) -> PeerLoad:
    """Every side's server started for ``clients``, warmed, then ``runs`` rotating rounds; a side
    whose requests fail is that one line, and the others go on."""
    shares: list[float] = []
    failed: dict[str, str] = {}
    with ExitStack() as stack:
        urls = [stack.enter_context(peer.start(clients)) for peer in peers]
        for peer, url in zip(peers, urls, strict=True):
            warm_up(url, {**round_work(1, tokens, 0)[0], **peer.extra})

        def side(peer: Peer, url: str) -> Callable[[], Side | None]:
            done = [0]  # the rounds this side has run: the next one's requests

            def run() -> Side | None:
                done[0] += 1
                if peer.name in failed:
                    return None
                mine = [{**body, **peer.extra} for body in round_work(requests, tokens, done[0])]
                before = forward_seconds(url) if peer.name == OURS else 0.0
                try:
                    measured = through_server(url, clients, mine)
                except RuntimeFailure as exc:
                    failed[peer.name] = str(exc)
                    return None
                if measured.tokens < 0.95 * len(mine) * tokens:  # a peer's chunk count may miss a held byte
                    failed[peer.name] = f"answered {measured.tokens} of {len(mine) * tokens} tokens"
                    return None
                if peer.name == OURS:
                    shares.append((forward_seconds(url) - before) / measured.wall_s)
                return measured

            return run

        figures = rounds(runs, [side(peer, url) for peer, url in zip(peers, urls, strict=True)])
    kept = {
        peer.name: [s for s in runs if s] for peer, runs in zip(peers, figures, strict=True) if peer.name not in failed
    }
    return PeerLoad(clients, requests, kept, shares if OURS in kept else [], failed)


def round_work(requests: int, tokens: int, number: int) -> list[dict[str, Any]]:
    """Round ``number``'s requests, the same on every side: prompts no earlier round asked
    (:func:`~llmsample.bench.prompts.distinct_prompts`), since a suffix pool drafts an answer it
    has seen. The same 8 prompts each round made ours 1.6-2.2x llama-server's tokens a second by
    the third round, greedy, and so did the same prompts numbered ("(Answer 3.1)"): 1 client
    1.07x in the first round of five and 2.65x in the last, 4 clients 0.97x and 1.50x
    (docs/history/2026-12.md). Longest prompt first: our server sizes llama.cpp's context for
    the first requests of a busy period (engine/decode.py), and a longer prompt that joins later
    found no room ("llama.cpp's cache has no room for 4 more tokens"), a bug of its own."""
    prompts = distinct_prompts(requests, number * requests)
    work = [{**body, "prompt": prompt, "ignore_eos": True}
            for body, prompt in zip(bodies(requests, tokens), prompts, strict=True)]  # fmt: skip
    return sorted(work, key=lambda body: -len(body["prompt"]))


def available_peers(
    ours_side: Peer, gguf: Path, threads: int, log: Callable[[str], None]
) -> tuple[list[Peer], dict[str, str]]:
    """Ours and whichever peers can run here; the others with the line that says why."""
    peers, skipped = [ours_side], {}
    try:
        peers.append(llama_server(ensure_llama_server(log), gguf, threads))
    except Unavailable as exc:
        skipped[LLAMA_SERVER] = str(exc)
    why = missing_server_extras()
    if why:
        skipped[LLAMA_CPP_PYTHON] = why
    else:
        peers.append(llama_cpp_python_server(gguf, threads))
    for name, line in skipped.items():
        log(f"{name} left out: {line}")
    return peers, skipped


def run_serve_peers(
    ours_side: Peer, gguf: Path, threads: int, counts: tuple[int, ...], requests: int | None, runs: int, tokens: int,
    log: Callable[[str], None],
) -> ServePeers:  # fmt: skip
    """Every client count in turn, each with servers of its own; ``requests`` per round (default
    twice the clients, at least 8: every client takes more than one)."""
    peers, skipped = available_peers(ours_side, gguf, threads, log)
    loads, load_at_start = [], os.getloadavg()[0]
    for clients in counts:
        count = requests or max(8, 2 * clients)
        log(
            f"{clients} client(s), {count} requests of {tokens} tokens: {', '.join(p.name for p in peers)}, {runs} round(s)"
        )
        started = time.perf_counter()
        loads.append(one_count(peers, clients, count, runs, tokens))
        log(f"{clients} client(s) done in {time.perf_counter() - started:.0f} s")
    return ServePeers(str(gguf), threads, tokens, runs, loads, skipped, (load_at_start, os.getloadavg()[0]))


def table(result: ServePeers) -> str:
    """The figures for the terminal: each side's medians, then ours over each peer against the
    issue's targets."""
    lines = [f"llmsample serve against its peers on {Path(result.gguf).name}, {result.threads} threads, "
             f"{result.tokens} new tokens a request, medians of {result.runs} round(s), load average "
             f"{result.load_average[0]:.1f} at the start, {result.load_average[1]:.1f} at the end"]  # fmt: skip
    lines += [f"  {name} left out: {why}" for name, why in result.skipped.items()]
    lines.append(f"  {'clients':>7}  {'side':<17} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p95':>9}")
    for load in result.loads:
        for name, runs in load.sides.items():
            median = statistics.median
            lines.append(f"  {load.clients:>7}  {name:<17} {median(s.tok_s for s in runs):>8.1f} "
                         f"{median(_ttft(runs, 'p50')):>8.2f}s {median(_ttft(runs, 'p95')):>8.2f}s")  # fmt: skip
        lines += [f"  {load.clients:>7}  {name} failed: {why}" for name, why in load.failed.items()]
        if load.forward_share:
            lines.append(
                f"  {load.clients:>7}  ours in forward passes {statistics.median(load.forward_share):.0%} of the time"
            )
        for name, ratio in load.ratios().items():
            lines.append(f"  {load.clients:>7}  {name:<38} {ratio:.2f}x{_verdict(name, ratio, load.clients)}")
    return "\n".join(lines)


def _verdict(name: str, ratio: float, clients: int) -> str:
    """The issue's target for a ratio against llama-server, and whether it was met."""
    if not name.endswith(LLAMA_SERVER):
        return ""
    kind = name.split(" ours")[0]
    if kind == "tok/s" and clients == 1:
        return ""  # the targets are at 4 and 16 clients
    bound = TARGETS[kind]
    met = ratio >= bound if kind == "tok/s" else ratio <= bound
    return f"  (target {'≥' if kind == 'tok/s' else '≤'} {bound}x: {'met' if met else 'missed'})"
