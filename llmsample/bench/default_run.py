"""What ``llmsample generate`` runs by default, as a benchmark's side: the command's own options
parsed from a command line (so its defaults, ``--draft`` included, are whatever the command's
are today), its own job (``build_job``) and its own in-process engine (``local_engine``), on a
model loaded once as the command loads it. Every request gets a fresh engine, as a fresh
``llmsample generate`` process starts with nothing learned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmsample.errors import UserError
from llmsample.events import Summary, TokenEvent
from llmsample.models.loading import LoadedModel


@dataclass
class Counts:
    """What runs made: new tokens, and drafted and accepted tokens (zero without drafting)."""

    tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, other: Counts) -> None:
        self.tokens += other.tokens
        self.drafted += other.drafted
        self.accepted += other.accepted

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def model_args(model: str | None, backend: str = "auto", gguf_type: str | None = None) -> list[str]:
    """The bench's model flags as a command's flags (only those given)."""
    return [*(["-m", model] if model else []), *(["--backend", backend] if backend != "auto" else []),
            *(["--gguf-type", gguf_type] if gguf_type else [])]  # fmt: skip


def command_options(command: Any, args: Sequence[str]) -> dict[str, Any]:
    """A command's options as its function receives them from ``args``, defaults filled in."""
    with command.make_context(command.name or "command", list(args)) as ctx:
        return dict(ctx.params)


def load_default(args: Sequence[str]) -> LoadedModel:
    """The model ``llmsample generate ARGS`` loads, loaded once; a default run must be on
    llama.cpp, where llama-cpp-python can run the same file."""
    from llmsample.commands.generate import generate
    from llmsample.commands.model_options import load_model_with_progress

    lm = load_model_with_progress({**command_options(generate, [*args, "-p", "-", "-q"]), "quiet": True})
    if lm.backend != "llama.cpp":
        raise UserError(f"the default run loads {lm.name} on {lm.backend}; llama-cpp-python needs a GGUF on llama.cpp")
    return lm


class DefaultGenerate:
    """``llmsample generate -p PROMPT ARGS`` on ``lm``; calling it runs one request and counts."""

    def __init__(self, lm: LoadedModel, args: Sequence[str]) -> None:
        self.lm, self.args = lm, list(args)

    def job(self, prompt: str, args: Sequence[str] = ()) -> tuple[dict[str, Any], Any]:
        """The command's options and job for ``prompt`` with these flags on top of the base ones."""
        from llmsample.commands.generate import build_job, generate, what_was_asked

        options = command_options(generate, [*self.args, *args, "-p", prompt, "-q"])
        preset, cfg, text = what_was_asked(options)
        return options, build_job(options, preset, cfg, text)

    def __call__(self, prompt: str, args: Sequence[str] = ()) -> Counts:
        from llmsample.commands.model_options import local_engine

        options, job = self.job(prompt, args)
        return count(local_engine(options, self.lm).run(job))


def count(records: Any) -> Counts:
    """A run's new tokens, and what its summary says it drafted and kept."""
    counts = Counts()
    for record in records:
        if isinstance(record, TokenEvent):
            counts.tokens += 1
        elif isinstance(record, Summary) and record.facts.speculation is not None:
            counts.drafted += record.facts.speculation.drafted
            counts.accepted += record.facts.speculation.accepted
    return counts
