"""The one builder of an engine row from a :class:`~llmsample.jobs.Job`: the prompt's ids as the
in-process run encodes them (a conversation's with its chat template, fitted to the context),
the run's record with what the model notes of itself, and ``--draft ngram``'s drafter. The
in-process engine and the server's job endpoint both build their rows here (tokenizer alone:
the drafter is made when the row starts, on the loop's thread)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmsample.engine.prompt import fit_exchanges, message_id_list, prompt_id_list
from llmsample.engine.row_state import BatchItem
from llmsample.errors import UserError
from llmsample.events import RunStats
from llmsample.jobs import AUTO, Job
from llmsample.models.loading import LoadedModel


def job_row(lm: LoadedModel, job: Job, key: Any, drafter: Callable[[], Any] | None = None) -> tuple[BatchItem, int]:
    """The job's row, and how many of a conversation's oldest exchanges were dropped to fit
    (``fit_room``). ``drafter``: the engine's own drafter for ``job.drafter`` (a suffix pool,
    a draft model), which the caller holds, or for ``auto`` with ``own_pool`` the same over an
    empty pool; ``job.ngram`` makes a prompt-lookup drafter here.
    A prompt that cannot be run (too long, no chat template) or a watched text that is no
    token raises ``UserError``."""
    dropped = 0
    if job.prompt_ids is not None:
        ids = list(job.prompt_ids)
    elif job.fit_room is not None and job.messages is not None:
        ids, dropped = fit_exchanges(lm, job.messages, job.fit_room)
    elif job.messages is not None:
        ids = message_id_list(lm, job.messages, job.truncate, job.cfg.max_tokens)
    else:
        ids = prompt_id_list(lm, job.prompt, job.system, job.raw, job.truncate, job.cfg.max_tokens)
    given = max((*(job.prompt_ids or ()), *job.prefix), default=0)  # ids from the caller, not the tokenizer
    if given >= lm.model.config.vocab_size:
        raise UserError(f"token {given} is no token of {lm.name} ({lm.model.config.vocab_size} in all)")
    ids = ids + list(job.prefix)
    stats = RunStats(model=lm.name, preset=job.preset, seed=job.cfg.seed)
    if lm.quantization:
        stats.note(quantization=lm.quantization)
    if lm.placed_on:
        stats.note(device_map=tuple(lm.placed_on))
    if job.ngram is not None:
        drafter = ngram_drafter(lm, *job.ngram)
    elif job.own_pool and job.drafter == AUTO and drafter is not None:
        drafter = drafter.fresh()  # the engine's auto drafters over an empty pool of the job's own
    watch = ()
    if job.watch:
        from llmsample.sampling.vocabulary import Vocabulary, named_tokens

        watch = named_tokens(Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids), job.watch, "--watch")
    item = BatchItem(key, ids, job.cfg, stats, drafter, job.draft_tokens, top_n=job.top_n,
                     cache_prompt=job.cache_prompt, ignore_eos=job.ignore_eos, watch=watch,
                     reference=job.reference)  # fmt: skip
    return item, dropped


def ngram_drafter(lm: LoadedModel, ngram_min: int, ngram_max: int) -> Callable[[], Any]:
    """``--draft ngram``'s drafter, one per row (it indexes that row's tokens), made when the row
    starts."""

    def make() -> Any:
        from llmsample.engine.speculative import NgramDrafter

        return NgramDrafter(lm.model.config.vocab_size, lm.sample_device, ngram_min, ngram_max)

    return make
