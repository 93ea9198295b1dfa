"""A request's rows: its settings over the server's defaults, its prompts' ids, checked so that
whatever a request asks for is its own 400 and never a failure of the loop every request shares.
Run on the tokenizing thread, with the tokenizer alone (no torch: see tests/serve/test_threads.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from llmsample.batch.requests import Request
from llmsample.batch.run import prompt_ids, request_config, shaped
from llmsample.batch.tool_requests import PLAIN, ChatShape
from llmsample.engine.row_state import BatchItem
from llmsample.errors import UserError
from llmsample.events import RunStats
from llmsample.models.loading import LoadedModel
from llmsample.sampling.vocabulary import Vocabulary
from llmsample.serve.api_errors import ApiError, bad_request
from llmsample.serve.parsing import ServeRequest
from llmsample.serve.state import ServeState


def build_items(state: ServeState, serve: ServeRequest, chat: bool) -> tuple[list[BatchItem], ChatShape]:
    """The request's rows (``n`` per prompt, in order) and how a chat answer's text is read
    back (its tools and thinking block)."""
    items, shape, asked = [], PLAIN, []
    for request, tokens in zip(serve.requests, serve.token_prompts, strict=True):
        rows, shape = _prompt_items(state, serve, request, tokens, chat)
        items += rows
        asked.append((request, rows))
    if state.engine.log is not None:  # every prompt's rows made: the request goes to the engine
        for request, rows in asked:
            state.engine.log.expect(request, rows)
    return items, shape


def _prompt_items(
    state: ServeState, serve: ServeRequest, request: Request, tokens: tuple[int, ...] | None, chat: bool
) -> tuple[list[BatchItem], ChatShape]:
    """One prompt's rows (``tokens``: sent as ids, taken as they are): its settings over the
    server's defaults, ``n`` rows with seeds ``seed, seed+1, ...``; a bad setting or a prompt
    that does not fit is a 400."""
    lm = state.lm
    try:
        preset, cfg = request_config(request, state.settings)
        ids = list(tokens) if tokens else prompt_ids(lm, request, state.settings, cfg.max_tokens)
        cfg, shape = shaped(lm, request, cfg, ids) if chat else (cfg, PLAIN)
    except UserError as exc:
        text = str(exc)
        if text.startswith("tools"):
            raise ApiError(400, text, "tools") from None
        if text.startswith("the prompt is") or "chat template" in text:
            raise ApiError(400, text, "messages" if chat else "prompt") from None
        raise bad_request(text) from None
    context = lm.context_length
    if context and len(ids) >= context:
        raise ApiError(400, f"prompt: {len(ids)} tokens leave no room in the context of {context}", "prompt")
    if context and serve.unlimited:
        cfg = dataclasses.replace(cfg, max_tokens=max(context - len(ids), 1))
    if context and len(ids) + cfg.max_tokens > context and not request.prompt_only:  # max_tokens 0: no room needed
        room = context - len(ids)
        if serve.max_tokens_key is not None:
            name = serve.max_tokens_key
            raise ApiError(
                400,
                f"{name}: {cfg.max_tokens} with a prompt of {len(ids)} tokens is beyond the context of "
                f"{context}; ask for at most {room}",
                name,
            )
        cfg = dataclasses.replace(cfg, max_tokens=room)
    if serve.ignore_eos:  # the end of text masked to the last token, as min_tokens masks it
        cfg = dataclasses.replace(cfg, min_tokens=cfg.max_tokens)
    _check_logit_bias(lm, cfg)
    if any(token >= len(lm.tokenizer) for token in serve.stop_ids):
        message = f"stop_token_ids: {list(serve.stop_ids)} holds an id past the vocabulary (0..{len(lm.tokenizer) - 1})"
        raise ApiError(400, message, "stop_token_ids")
    items = []
    for i in range(serve.n):
        row_cfg = dataclasses.replace(cfg, seed=((cfg.seed or 0) + i) % 2**63) if i else cfg
        stats = RunStats(lm.name, preset, row_cfg.seed)
        key = state.engine.new_key()
        draft = (state.drafter, state.settings.draft_tokens)
        ends = (frozenset(serve.stop_ids), serve.keep_stop)
        items.append(BatchItem(key, ids, row_cfg, stats, *draft, _top_n(state, serve), *ends))
    return items, shape


def prompt_texts(lm: LoadedModel, serve: ServeRequest) -> ServeRequest:
    """Token-id prompts checked against the vocabulary and given their text (``echo``,
    ``text_offset``), with the tokenizer alone (no torch on this thread)."""
    if not any(serve.token_prompts):
        return serve
    size, requests = len(lm.tokenizer), []
    for request, tokens in zip(serve.requests, serve.token_prompts, strict=True):
        if tokens and max(tokens) >= size:
            raise ApiError(400, f"prompt: token id {max(tokens)} is past the vocabulary (0..{size - 1})", "prompt")
        text = lm.tokenizer.decode(list(tokens), skip_special_tokens=False) if tokens else request.prompt
        requests.append(dataclasses.replace(request, prompt=text))
    return dataclasses.replace(serve, requests=tuple(requests))


def _top_n(state: ServeState, serve: ServeRequest) -> int:
    """The alternatives a request's records show: the engine's all for ``tokens: full``, the
    asked-for top log probabilities, else none (no candidate list built for every token)."""
    if serve.tokens == "full":
        return state.engine.options.top_n
    request = serve.request
    return request.top_logprobs if request.logprobs else 0


def _check_logit_bias(lm: LoadedModel, cfg: Any) -> None:
    """Texts in ``logit_bias`` must be one token each: checked here, so a bad one is this
    request's 400 and never a failure in the loop that every other request shares. With the
    tokenizer alone: a torch operation on this thread would start an OpenMP team of its own and
    slow every forward pass of the engine's (see :mod:`llmsample.serve.engine`)."""
    if not cfg.logit_bias:
        return
    vocabulary = Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids)
    for token, _ in cfg.logit_bias:
        try:
            vocabulary.token_id(token)
        except ValueError as exc:
            raise ApiError(400, f"logit_bias: {exc}", "logit_bias") from None
