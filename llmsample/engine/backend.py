"""The seam between the decoding loop and a forward-pass implementation: a backend owns the KV
cache of a changing set of rows and hands back float32 logits on ``sample_device``; the loop
(:mod:`llmsample.engine.decode`) owns everything else (sampling, records, stops, drafting).

A row is addressed by its index in the backend's current order: :meth:`Backend.admit` appends
rows, :meth:`Backend.keep` drops and reorders them. Four implementations ship:
:class:`llmsample.engine.padded.PaddedBatch` (transformers' model or llmsample's own torch
forward, one left-padded cache with a mask: rows join and leave at any step, ragged verification,
per-row rollback), :class:`llmsample.engine.lockstep.LockstepBatch` (transformers, rows of one
prompt advancing together: the compiled static cache and tensor parallelism),
:class:`llmsample.engine.static.StaticBatch` (the compiled step over a left-padded static cache:
requests with their own prompts, in waves) and :class:`llmsample.engine.llamacpp_batch.LlamaCppBatch`,
which maps the same calls onto llama.cpp's sequence ids: ``admit`` decodes each prompt under a
new id, ``verify`` carries the ragged tokens with their ids in one ``llama_batch``, ``rollback``
is ``seq_rm``, ``replicate`` is ``seq_cp``, ``keep`` removes the ids that left. Two more wrap
one of those: :class:`llmsample.engine.deterministic.DeterministicBackend` (every row alone, one
position per pass) and :class:`llmsample.engine.prompt_cache.CachingBackend` (rows admitted from
the prompt cache)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from llmsample.models.loading import LoadedModel

if TYPE_CHECKING:
    from llmsample.engine.prompt_cache import Prefixes


class Backend(Protocol):
    """What the loop needs of a model with its cache. Its optional parts are declared, None
    where a backend lacks them: ``prefixes`` (a row's prefix kept, and a new row admitted from
    it: what the prompt cache needs), ``joining`` (rows joining prefilled in the running rows'
    pass), ``layers`` (a prompt's layers read: ``explain --layers``); ``reused`` is a prompt
    cache's (:class:`~llmsample.engine.prompt_cache.CachingBackend`), None on every other."""

    sample_device: torch.device
    can_join: bool  # rows may be admitted while others are decoding (else: once none is)
    ragged: bool  # rows may verify different numbers of tokens and roll back on their own
    splits_ragged: bool  # such a pass costs a pass per count (so drafts pay only for a row alone)
    compile_s: float  # what building a compiled step cost this run (0: none, or reused)
    prefixes: Prefixes | None
    joining: Joining | None
    layers: Layers | None
    reused: list[int] | None  # tokens each prompt of the last admit took from the prompt cache

    def admit(self, prompts: list[list[int]]) -> Tensor:
        """Prefill ``prompts`` as new last rows; their next-token logits ``[len(prompts), vocab]``."""
        ...

    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        """``copies`` new rows of one prompt, prefilled once where the backend can replicate a row."""
        ...

    def step(self, tokens: Tensor) -> Tensor:
        """One token per row (``[rows]``) in; next-token logits ``[rows, vocab]`` out."""
        ...

    def verify(self, tokens: list[list[int]]) -> Tensor:
        """Several tokens per row (at least one each); logits after each, ``[rows, longest, vocab]``
        (positions past a row's own count are padding)."""
        ...

    def rollback(self, row: int, length: int) -> None:
        """Forget row ``row``'s cached positions from ``length`` on (a rejected draft)."""
        ...

    def keep(self, rows: list[int]) -> None:
        """Only these rows go on, in this order (the others finished, failed or were cancelled)."""
        ...

    def agree(self, tokens: Tensor) -> Tensor:
        """The tokens every process feeds next (tensor parallelism: rank 0's); else ``tokens``."""
        ...

    def close(self) -> None:
        """Give back what the run leased (a compiled step); idempotent."""
        ...


class Layers(Protocol):
    """A backend's optional ``layers``: a prompt's layers read (``explain --layers``): the padded batch."""

    def admit_layers(self, prompt: list[int]) -> Tensor:
        """:meth:`Backend.admit` of one prompt, with the logit lens at its last position
        ``[layers + 1, vocab]`` (embeddings first, the model's own logits last)."""
        ...


class Joining(Protocol):
    """A backend's optional ``joining``: rows joining prefilled in the running rows' pass
    (llama.cpp's sequences: llama-server's mixed batches), rather than in a pass of their own."""

    def joins(self, prompts: list[list[int]], whole: Collection[int] = ()) -> bool:
        """Whether :meth:`forward_joining` takes these prompts (``whole``: the indices of those
        that may not start from a cached prefix)."""
        ...

    def forward_joining(
        self, fed: list[list[int]], prompts: list[list[int]], whole: Collection[int] = ()
    ) -> tuple[Tensor, Tensor]:
        """:meth:`Backend.verify` of ``fed``, its logits flat in fed order ``[tokens, vocab]``, then
        :meth:`Backend.admit` of ``prompts`` (``whole``: as in :meth:`joins`), its logits, in one
        pass."""
        ...


def open_backend(
    lm: LoadedModel,
    rows: int,
    positions: int,
    one_prompt: bool,
    on_forward: Callable[[float], None] | None = None,
    *,
    steps: bool = True,
    deterministic: bool = False,
    longest: int = 0,
) -> Backend:
    """The backend a run decodes through. A model split over processes (``--tp``) needs rows that
    advance in lockstep over one prompt; a compiled one (``--compile``) runs one prompt's rows in
    lockstep and requests with their own prompts in waves over a padded static cache; everything
    else runs on the padded batch, where rows join, leave and verify drafts on their own (sliding
    windows included), unless the model's cache cannot be padded (linear attention, say): then
    one prompt's rows, or one request at a time, in lockstep.
    ``on_forward``: told the seconds of each forward pass (the padded batch's; benchmarks);
    ``steps``: False where the run only admits and verifies (teacher forcing, a draft model's
    cache), which a compiled one-token step would not serve.
    ``deterministic`` (a run's mode, ``--deterministic``): every row runs on a one-row backend of
    its own, one position per pass (:mod:`llmsample.engine.deterministic`), without a prompt
    cache. ``longest``: the positions one row may take, where rows of unknown length join later
    (a server's: a cache made once holds at least that)."""
    if deterministic:
        from llmsample.engine.deterministic import DeterministicBackend

        return DeterministicBackend(lambda: _open(lm, 1, positions, True, on_forward, steps, longest))
    return _open(lm, rows, positions, one_prompt, on_forward, steps, longest)


def _open(
    lm: LoadedModel,
    rows: int,
    positions: int,
    one_prompt: bool,
    on_forward: Callable[[float], None] | None,
    steps: bool,
    longest: int = 0,
) -> Backend:
    from llmsample.engine.lockstep import LockstepBatch
    from llmsample.engine.padded import PaddedBatch
    from llmsample.engine.static import StaticBatch
    from llmsample.errors import UserError

    if lm.backend == "llama.cpp":
        from llmsample.engine.llamacpp_batch import LlamaCppBatch

        return LlamaCppBatch(lm.model, rows, positions, on_forward, longest)
    if lm.tensor_parallel:
        if not one_prompt:
            raise UserError(
                "--tp decodes rows of one prompt in lockstep; requests with their own prompts run without --tp"
            )
        return LockstepBatch(lm, rows, positions)
    if lm.compiled is not None and steps:
        return LockstepBatch(lm, rows, positions) if one_prompt else StaticBatch(lm, rows, positions)
    if PaddedBatch.supports(lm.model):
        return PaddedBatch(lm.model, lm.sample_device, on_forward)
    if one_prompt or rows == 1:  # a cache the padded batch cannot hold: one prompt's rows in lockstep
        return LockstepBatch(lm, rows, positions)
    raise UserError(
        f"{lm.name!r} keeps a cache (not plain attention layers) that requests with their own prompts cannot "
        "share; run them one at a time with --batch-size 1"
    )
