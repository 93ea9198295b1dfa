"""``/v1/completions``' prompt scoring, what lm-evaluation-harness's ``local-completions``
log-likelihoods send (``echo: true``, ``logprobs: N``, ``max_tokens`` 0 or 1): with ``echo`` and
``logprobs`` each prompt's tokens are scored by teacher forcing
(:mod:`llmsample.engine.prompt_logprobs`) on the engine's thread, between two steps of the batch,
as ``explain`` runs there (a pass beside the loop would start a second OpenMP team: see
:mod:`llmsample.serve.engine`); with ``max_tokens: 0`` no row is decoded at all, and each
choice ends at once, so the answer is built by the same code as any other."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import TYPE_CHECKING

from llmsample.errors import RuntimeFailure
from llmsample.events import Summary
from llmsample.serve.api_errors import ApiError
from llmsample.serve.engine import Closing
from llmsample.serve.mailbox import Mailbox
from llmsample.serve.parsing import ServeRequest
from llmsample.serve.state import ServeState

if TYPE_CHECKING:
    from llmsample.engine.row_state import BatchItem
    from llmsample.events import PromptLogprobs
    from llmsample.models.loading import LoadedModel


def scores_prompt(serve: ServeRequest, chat: bool) -> bool:
    """Whether the answer carries its prompts' log probabilities (completions' echo with logprobs)."""
    return not chat and serve.echo and serve.request.logprobs


async def with_prompt_logprobs(state: ServeState, serve: ServeRequest, items: list[BatchItem]) -> ServeRequest:
    """``serve`` with each prompt's tokens scored (once per prompt, whatever its ``n``), on the
    engine's thread: the rows in flight wait for that pass, as they wait for a prefill."""
    prompts = [item.prompt_ids for item in items[:: serve.n]]
    work = functools.partial(_score, state.lm, prompts, serve.request.top_logprobs)
    closing = ApiError(503, "the server is shutting down", None, "shutting_down")
    try:
        future = state.engine.call(work)
    except Closing:
        raise closing from None
    try:
        scored = await asyncio.wrap_future(future)
    except RuntimeFailure as exc:
        raise ApiError(500, f"scoring the prompt failed: {exc}", None, "decoding_failed") from None
    except RuntimeError:
        if state.engine.closing:  # the feed closed before the work ran
            raise closing from None
        raise
    return dataclasses.replace(serve, prompt_logprobs=tuple(scored))


def _score(lm: LoadedModel, prompts: list[list[int]], top_n: int) -> list[PromptLogprobs]:
    from llmsample.engine.prompt_logprobs import prompt_logprobs

    return [prompt_logprobs(lm, ids, top_n) for ids in prompts]


def ended_at_once(state: ServeState, items: list[BatchItem]) -> Mailbox:
    """``max_tokens: 0``: the rows' mailbox, holding each row's end already (no token decoded,
    ``finish_reason: "length"``, its prompt counted); the engine never sees them."""
    if state.engine.log is not None:  # nothing was decoded: no run to log
        state.engine.log.forget(items)
    queue = Mailbox(asyncio.get_running_loop())
    queue.extend([(item.key, _nothing_decoded(item)) for item in items])
    return queue


def _nothing_decoded(item: BatchItem) -> Summary:
    return dataclasses.replace(item.stats.summary("length"), prompt_tokens=len(item.prompt_ids))
