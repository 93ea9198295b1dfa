"""llama-cpp-python's own generation as a benchmark's peer: its plain ``Llama`` on the GGUF our
side loaded, with our side's threads, prompt ids and sampler settings, from an empty cache (as
our side starts), stopping where our loop stops (an end-of-sequence id, or the token cap)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from llmsample.errors import UserError
from llmsample.sampling.config import SamplingConfig


def peer_arguments(cfg: SamplingConfig) -> dict[str, float | int]:
    """Our settings as ``Llama.generate``'s arguments; a setting it has no twin for is refused,
    so the two sides never run different samplers unnoticed."""
    plain = SamplingConfig()
    own = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens", "seed", "description"}
    names = [f.name for f in fields(cfg) if f.name not in own]
    differing = [name for name in names if getattr(cfg, name) != getattr(plain, name)]
    if differing:
        raise UserError(f"llama-cpp-python's peer has no twin for {differing[0]}; leave it at its default")
    return {"temp": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p, "min_p": cfg.min_p,
            "repeat_penalty": cfg.repetition_penalty}  # fmt: skip


class PeerGenerate:
    """``Llama.generate`` on ``path``: its plain default, no drafter."""

    def __init__(self, path: Path, threads: int, eos: Collection[int]) -> None:
        from llmsample.models.llamacpp_load import plain_llama

        self.llm = plain_llama(path, threads)
        self.eos = frozenset(eos)

    def __call__(self, prompt: Sequence[int], cfg: SamplingConfig, ignore_eos: bool = False) -> int:
        """Tokens made for ``prompt`` under ``cfg`` (its seed, its cap)."""
        llm = self.llm
        llm.reset()  # a warm cache would skip the prefill our side pays (see llamacpp_peers)
        llm.set_seed(cfg.seed if cfg.seed is not None else 0)
        count = 0
        if cfg.max_tokens < 1:
            return 0
        for token in llm.generate(list(prompt), reset=True, **peer_arguments(cfg)):  # type: ignore[arg-type]
            if token in self.eos and not ignore_eos:
                break
            count += 1
            if count == cfg.max_tokens:
                break
        return count

    def close(self) -> None:
        close: Any = getattr(self.llm, "close", None)
        if close is not None:
            close()
