"""Which engine a command runs on, decided from its options before anything heavy is imported:
``--local`` (in this process), ``--host URL`` / ``LLMSAMPLE_HOST`` (that server, or a one-line
error), else a warm engine of this user's started with the same model options, else in-process.
``--deterministic`` is one of those options: such a command finds only an engine started with
it (``llmsample start --deterministic``), and a server given by ``--host`` refuses it unless it
runs in that mode."""

from __future__ import annotations

import os
from typing import Any

from llmsample.client import registry
from llmsample.client.connection import Target, address
from llmsample.errors import UserError
from llmsample.jobs import Capabilities
from llmsample.version import __version__

UNSERVED = {
    "tp": "--tp",
    "compile_model": "--compile",
    "device_map": "--device-map",
    "max_memory": "--max-memory",
    "offload_folder": "--offload-folder",
}
"""Options no engine's rows can take (how the model is split, compiled or placed): refused in one
line when an engine would run the command, never dropped. What an engine may hold or not (a
draft model, a reference) is its :class:`~llmsample.jobs.Capabilities`'."""


def unserved(options: dict[str, Any], refused: list[str] | None = None, offered: Capabilities | None = None) -> str | None:
    """The first option given that the engine cannot honour: ``refused``, a command's own such
    flags; one of :data:`UNSERVED`; or, given what the engine holds (``offered``, from its
    record), a drafter or a reference it lacks (a server at ``--host`` answers that itself)."""
    if refused:
        return refused[0]
    flag = next((flag for key, flag in UNSERVED.items() if options.get(key)), None)
    if flag is None and offered is not None:
        asked = Capabilities(registry.draft_of(options), bool(options.get("reference")))
        flag = offered.lacking(asked, options.get("draft"))
    return flag


def choose(options: dict[str, Any], refused: list[str] | None = None) -> Target | None:
    """The engine to run on, or None for the in-process run; ``refused``: flags of the command's
    own that an engine cannot honour (refused in one line when an engine would run it)."""
    if options.get("local"):
        return None
    host = hosted(options)
    if host:
        flag = unserved(options, refused)
        if flag:
            raise UserError(f"{flag} does not run on an engine (--host / LLMSAMPLE_HOST); leave it out or pass --local")
        return Target(host, os.environ.get("LLMSAMPLE_API_KEY") or None, options.get("model"),
                      bool(options.get("deterministic")))
    if not _has_engines():
        return None
    record = registry.find(registry.spec_of(options))
    if record is None:
        return None
    flag = unserved(options, refused, record.capabilities)
    if flag:
        started = f", or start it with {flag}" if flag.startswith(("--draft", "--reference")) else ""
        raise UserError(
            f"{flag} does not run on the warm engine for {record.name}; leave it out{started}, or pass --local to run here"
        )
    if record.version != __version__:
        raise UserError(
            f"the warm engine for {record.name} runs llmsample {record.version}, this is {__version__}: "
            f"restart it (llmsample stop --all; llmsample start) or pass --local"
        )
    return Target(record.where, name=record.name, deterministic=record.deterministic, keep_alive_s=record.keep_alive_s)


def hosted(options: dict[str, Any]) -> str | None:
    """The server given by ``--host`` or ``LLMSAMPLE_HOST``, checked before anything loads: a
    value that is no server's URL is one line naming where it came from (exit 2)."""
    given = options.get("host")
    source, host = ("--host", given) if given else ("LLMSAMPLE_HOST", os.environ.get("LLMSAMPLE_HOST"))
    if not host:
        return None
    if host.startswith("unix:"):  # an engine's own socket, as ``llmsample ps`` shows it
        return host
    try:
        address(host)
    except ValueError as exc:
        raise UserError(f"{source} {host!r}: {exc}; expected a URL such as http://HOST:PORT") from None
    return host.rstrip("/")


def _has_engines() -> bool:
    """Whether there is an engine directory at all: a command never creates it."""
    return registry.runtime_path().is_dir()
