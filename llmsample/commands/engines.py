"""``llmsample start``, ``ps`` and ``stop``: warm engines (``serve`` on a per-user Unix socket)
that decoding commands use instead of loading the model themselves."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from llmsample.client import registry
from llmsample.commands.help import GroupedCommand
from llmsample.commands.model_options import model_options
from llmsample.commands.options import quiet_option
from llmsample.errors import RuntimeFailure, UserError
from llmsample.jobs import Capabilities

START_TIMEOUT_S = 900  # converting the default model on a first run takes tens of seconds; a big one, minutes
STOP_TIMEOUT_S = 30


def parse_duration(text: str) -> float | None:
    """``10m``, ``30s``, ``1h``, plain seconds; ``never``: no expiry (None)."""
    if text == "never":
        return None
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if not found or float(found.group(1)) <= 0:
        raise UserError(f"--keep-alive {text!r}: expected a duration such as 30s, 10m, 1h, or never")
    return float(found.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[found.group(2)]


def format_duration(seconds: float | None) -> str:
    """A keep-alive as :func:`parse_duration` reads it, in the largest unit it is a whole number
    of: ``--keep-alive 30m`` comes back as ``30m``, not ``1800s`` (the record holds seconds)."""
    if seconds is None:
        return "never"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One ``start`` of a spec at a time: a second waits, then finds the first's engine."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@click.command(cls=GroupedCommand)
@model_options
@click.option("--batch-size", type=click.IntRange(1, 1024), help="Rows decoded together [default: by memory].")
@click.option("--max-queue", type=click.IntRange(0, 100000), help="Rows that may wait for a free one [default: 256].")
@click.option("--keep-alive", default="10m", show_default=True, metavar="DURATION",
              help="Stop after this long without work: 30s, 10m, 1h, or never.")  # fmt: skip
@click.option("--deterministic", is_flag=True,
              help="Every row computed alone, one position per pass (docs/determinism.md): commands run with "
              "--deterministic use this engine, and only they.")  # fmt: skip
@click.option("--draft", metavar="MODEL|suffix",
              help="A draft model (sharing the model's tokenizer) or a suffix pool the engine holds: commands "
              "run with the same --draft speculate on it.")  # fmt: skip
@click.option("--reference", is_flag=True,
              help="Also hold the checkpoint in float32: commands run with --reference score their tokens on it.")
@quiet_option()
def start(**options: Any) -> None:
    """Start a warm engine: the model stays loaded, and generate, speculate, chat, batch, compare-presets
    and explain run on it (a fraction of a second to the first token).

    Returns once the model is loaded and prints where the engine listens. A second start of the
    same model reuses the running engine.

    \b
    llmsample start
    llmsample start -m HuggingFaceTB/SmolLM2-360M-Instruct --keep-alive 1h
    llmsample start --deterministic    # for batch/generate --deterministic, and compare-presets
    llmsample start --draft suffix      # for speculate/generate/batch --draft suffix
    llmsample start --reference         # for generate/batch --reference
    """
    if options["compile_model"]:
        raise UserError(
            "--compile decodes rows of one prompt in lockstep; an engine's rows have their own: leave it out"
        )
    keep_s = parse_duration(options["keep_alive"])
    record, running = running_engine(options, keep_s)
    mode = ", deterministic" if record.deterministic else ""
    if running:
        asked = Capabilities(registry.draft_of(options), bool(options["reference"]))
        flag = record.capabilities.lacking(asked, options["draft"])
        if flag:
            raise UserError(f"the engine for {record.name} already runs without {flag}: stop it first "
                            f"(llmsample stop {record.name}), then start it with {flag}")  # fmt: skip
        click.echo(f"{record.where} (already running: {record.name}{mode}, pid {record.pid})")
        return
    keeps = "never stops by itself" if keep_s is None else f"keep-alive {options['keep_alive']}"
    click.echo(f"{record.where} ({record.name}, {record.backend} {record.dtype}{mode}, pid {record.pid}, {keeps})")


def running_engine(options: dict[str, Any], keep_s: float | None) -> tuple[registry.EngineRecord, bool]:
    """The engine of ``options``' model options, and whether it was running: else one started
    here (``start``'s, and a chat's whose engine stopped), one start of a spec at a time."""
    directory = registry.runtime_dir()
    spec = registry.spec_of(options)
    ident = registry.engine_id(spec)
    registry.socket_path(directory, ident)  # a directory too deep for a socket: one line before the model loads
    with _locked(directory / f"{ident}.lock"):
        record = registry.find(spec, directory)
        if record is not None:
            return record, True
        return _spawn(options, directory, ident, keep_s), False


def _spawn(options: dict[str, Any], directory: Path, ident: str, keep_s: float | None) -> registry.EngineRecord:
    """The engine in a session of its own (a Ctrl-C at this terminal later does not reach it)."""
    command = [sys.executable, "-m", "llmsample", "serve", "--engine", "-q", "--device", options["device"],
               "--dtype", options["dtype"], "--backend", options["backend"]]  # fmt: skip
    for flag, key in (("-m", "model"), ("--batch-size", "batch_size"), ("--max-queue", "max_queue")):
        if options[key] is not None:
            command += [flag, str(options[key])]
    if keep_s is not None:
        command += ["--keep-alive", repr(keep_s)]
    if options["deterministic"]:
        command.append("--deterministic")
    if options.get("draft") not in (None, "ngram"):
        command += ["--draft", options["draft"]]
    if options.get("reference"):
        command.append("--reference")
    log = directory / f"{ident}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)  # fmt: skip
    if not options["quiet"]:
        click.echo(f"loading {options['model'] or 'the default model'} in a new engine ...", err=True)
    try:
        return _wait_ready(proc, directory, ident, log)
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
        raise


def _wait_ready(proc: subprocess.Popen, directory: Path, ident: str, log: Path) -> registry.EngineRecord:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        record = next((r for r in registry.engines(directory) if r.id == ident and r.pid == proc.pid), None)
        if record is not None:
            return record
        if proc.poll() is not None:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            reason = lines[-1].removeprefix("Error: ") if lines else f"exit status {proc.returncode}"
            raise RuntimeFailure(f"the engine did not start: {reason}")
        time.sleep(0.1)
    raise RuntimeFailure(f"the engine did not start within {START_TIMEOUT_S} s (see {log})")


@click.command(cls=GroupedCommand)
def ps() -> None:
    """List the running engines: model, backend, dtype, mode, rows in flight, memory, idle time.

    MODE is ``deterministic`` for an engine started with --deterministic (every row computed
    alone), else ``batched``; then what it holds beyond its rows (``+drafter``, ``+reference``)."""
    from llmsample.client.connection import Target, engine_status

    rows = []
    for record in registry.engines():
        try:
            status = engine_status(Target(record.where), timeout=2)
            rows_in, idle = str(status["in_flight"]), f"{status['idle_s']:.0f}s"
        except (RuntimeFailure, UserError, KeyError, ValueError):
            rows_in, idle = "?", "?"
        keep = format_duration(record.keep_alive_s)
        mode = "+".join(["deterministic" if record.deterministic else "batched", *record.capabilities.names()])
        rows.append((record.name, record.backend, record.dtype, mode, rows_in, _memory(record.pid), idle, keep,
                     str(record.pid), record.where))  # fmt: skip
    if not rows:
        click.echo("no engines running (llmsample start starts one)", err=True)
        return
    header = ("MODEL", "BACKEND", "DTYPE", "MODE", "ROWS", "MEMORY", "IDLE", "KEEP-ALIVE", "PID", "WHERE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _memory(pid: int) -> str:
    """The engine's resident memory, from /proc (Linux); ``?`` elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return f"{int(line.split()[1]) / 2**20:.2f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "?"


@click.command(cls=GroupedCommand)
@click.argument("model", required=False)
@click.option("--all", "every", is_flag=True, help="Stop every engine of this user.")
def stop(model: str | None, every: bool) -> None:
    """Stop an engine (by model; the only one when one runs), or --all."""
    running = list(registry.engines())
    if model is not None:
        wanted = os.path.realpath(model) if os.path.isdir(model) else model
        running = [r for r in running if wanted in (r.name, r.spec.get("model"))]
        if not running:
            raise UserError(f"no engine runs {model!r} (llmsample ps lists them)")
    elif not every and len(running) > 1:
        raise UserError(f"{len(running)} engines run; name the model to stop or pass --all (llmsample ps lists them)")
    for record in running:
        _stop(record)
        click.echo(f"stopped {record.name} ({record.where})", err=True)


def _stop(record: registry.EngineRecord) -> None:
    """SIGTERM (rows in flight end, cancelled), then wait for the process to go."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while registry.alive(record.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if registry.alive(record.pid):
        raise RuntimeFailure(f"the engine (pid {record.pid}) did not stop within {STOP_TIMEOUT_S} s")
    registry.remove_record(registry.runtime_dir(), record.id, record.pid)
