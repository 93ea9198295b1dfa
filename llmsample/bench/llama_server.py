"""llama.cpp's own ``llama-server``, the peer ``bench --serve-peers`` measures our server against:
built once from the llama.cpp that llama-cpp-python's sdist vendors (the same commit as the
kernels our llama.cpp backend runs), cached by that version, and started on a GGUF.

The build is minutes of CPU, so it runs at ``nice 19`` on two jobs (a machine's other work keeps
its cores), only the ``llama-server`` target, static (one file, no libraries to find at run time).
It happens in a staging folder renamed into place when done: a killed build leaves no binary that
looks finished. Where it cannot happen (no cmake, no compiler, no sdist), :class:`Unavailable`
says why in one line and the benchmark skips this side."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmsample.models.gguf_to_hf import PARTIAL, cache_home

CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")  # fmt: skip
"""Release, CPU-native like a pip build of llama-cpp-python, no network at build or run time
(no curl, no prebuilt web UI fetched from the hub), static."""
JOBS = 2


class Unavailable(Exception):
    """This side cannot run here; the message is the one line that says why."""


def llama_cpp_python_version() -> str:
    """The installed llama-cpp-python's version: the vendored llama.cpp to build."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise Unavailable(
            "llama-cpp-python is not installed (make llamacpp), so there is no llama.cpp to match"
        ) from exc


def binary_path(version: str) -> Path:
    """Where the built ``llama-server`` for ``version`` lives (it exists only once complete)."""
    return cache_home() / "llama-server" / f"llama-cpp-python-{version}" / "llama-server"


def missing_tools(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """Why no build can run here, or None: cmake and a C++ compiler are needed."""
    if which("cmake") is None:
        return "no cmake found to build llama-server (apt-get install cmake, or pip install cmake)"
    if not any(which(name) for name in (os.environ.get("CXX", "c++"), "c++", "g++", "clang++")):
        return "no C++ compiler found to build llama-server (apt-get install g++)"
    return None


def ensure_llama_server(log: Callable[[str], None] = lambda step: None, version: str | None = None) -> Path:
    """The cached ``llama-server`` for the installed llama-cpp-python, built first if missing;
    :class:`Unavailable` where it cannot be."""
    version = version or llama_cpp_python_version()
    target = binary_path(version)
    if target.is_file():
        return target
    why = missing_tools()
    if why:
        raise Unavailable(why)
    builder = building_now(target.parent)
    if builder is not None:
        raise Unavailable(f"process {builder} is building llama-server now; run again once it is done")
    log(f"building llama-server from llama-cpp-python {version}'s llama.cpp, once (many CPU minutes, nice 19)")
    with staging_folder(target.parent) as staging:
        source = fetch_source(version, staging / "sdist")
        build_server(source, staging / "build", staging / "llama-server")
        shutil.rmtree(staging / "sdist")
        shutil.rmtree(staging / "build")
    return target


def building_now(final: Path) -> int | None:
    """The process id of a live build of ``final`` (its staging folder names it); the folders
    of builds that died are removed."""
    for staging in final.parent.glob(f".{final.name}{PARTIAL}*"):
        pid = int(staging.name.rsplit(PARTIAL, 1)[1].split("-")[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(staging, ignore_errors=True)
            continue
        except PermissionError:
            pass
        return pid
    return None


@contextmanager
def staging_folder(final: Path) -> Iterator[Path]:
    """A sibling of ``final`` to build in, renamed to ``final`` when the block ends well and
    removed when it does not (another process that finished first wins; ours is dropped)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}{PARTIAL}{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        yield staging
        try:
            staging.rename(final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_source(version: str, into: Path) -> Path:
    """llama-cpp-python's sdist for ``version``, unpacked into ``into``; its ``vendor/llama.cpp``."""
    into.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet",
         "-d", str(into), f"llama-cpp-python=={version}"],
        capture_output=True, text=True,
    )  # fmt: skip
    archives = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        raise Unavailable(f"could not download llama-cpp-python {version}'s source with pip: {_last_line(done.stderr)}")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(into, filter="data")
    found = next(into.glob("llama_cpp_python-*/vendor/llama.cpp/CMakeLists.txt"), None)
    if found is None:
        raise Unavailable(f"llama-cpp-python {version}'s sdist has no vendor/llama.cpp to build")
    return found.parent


def build_server(source: Path, build: Path, out: Path, cmake: str = "cmake") -> None:
    """Configure and build the ``llama-server`` target of ``source`` in ``build``, then copy the
    binary to ``out``; :class:`Unavailable` with cmake's last words when a step fails."""
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    steps = {
        "configure": [*nice, cmake, "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
        "build": [
            *nice,
            cmake,
            "--build",
            str(build),
            "--config",
            "Release",
            "--target",
            "llama-server",
            "-j",
            str(JOBS),
        ],
    }
    for name, step in steps.items():
        with tempfile.TemporaryFile("w+") as output:
            done = subprocess.run(step, stdout=output, stderr=subprocess.STDOUT, text=True)
            if done.returncode != 0:
                output.seek(0)
                raise Unavailable(f"building llama-server failed at cmake's {name} step: {_last_error(output.read())}")
    built = next(
        (p for p in (build / "bin" / "llama-server", build / "bin" / "Release" / "llama-server") if p.is_file()), None
    )
    if built is None:
        raise Unavailable("building llama-server finished without a bin/llama-server")
    shutil.copy2(built, out)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _last_error(text: str) -> str:
    """The first line that says error, else the last line (make's summary says less)."""
    errors = [line.strip() for line in text.splitlines() if re.search(r"\berror\b", line, re.IGNORECASE)]
    return errors[0][:300] if errors else _last_line(text)[:300]


def server_command(binary: Path, gguf: Path, threads: int, parallel: int, context: int) -> list[str]:
    """``llama-server`` on ``gguf`` at our thread count: ``parallel`` slots sharing ``context``
    tokens (``-c`` is split between the slots), flash attention off as our backend runs (its
    ``-fa auto`` turns it on for a CPU); the caller adds ``--port``."""
    return [str(binary), "-m", str(gguf), "--threads", str(threads), "--threads-batch", str(threads),
            "-np", str(parallel), "-c", str(context), "-fa", "off", "--host", "127.0.0.1", "--no-webui"]  # fmt: skip


def wait_ready(url: str, alive: Callable[[], bool], seconds: float = 300.0) -> None:
    """Poll ``url`` (a server's ``/health``) until it answers 200, the model loaded;
    RuntimeError when the process exits first or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("exited before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {seconds:.0f} s")
