"""Answers in OpenAI's shapes: ``chat.completion`` and ``text_completion`` bodies, their stream
chunks (``chat.completion.chunk``; completions stream ``text_completion`` objects), ``usage``,
``finish_reason`` and ``system_fingerprint``. Log probabilities are the batch command's
(:mod:`llmsample.batch.result_lines`: the raw model's, as OpenAI and vLLM report them). Our own
figures go under the key ``llmsample`` of each choice when the request asked for them."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from llmsample.batch.result_lines import (
    FINISH_REASONS,
    TokenLevel,
    _chat_logprobs,
    _completion_logprobs,
    _full,
    dumps,
    joined_columns,
    prompt_columns,
)
from llmsample.batch.tool_requests import PLAIN, ChatShape, call_start, message
from llmsample.events import Summary, TokenEvent
from llmsample.serve.parsing import ServeRequest
from llmsample.serve.tool_stream import StreamSplit
from llmsample.version import __version__


def fingerprint(model: str, dtype: str, device: str) -> str:
    """What produced the answers: a different version, model, dtype or device, another fingerprint."""
    digest = hashlib.sha256(f"{__version__}|{model}|{dtype}|{device}".encode()).hexdigest()[:12]
    return f"fp_{digest}"


def finish_reason(summary: Summary) -> str:
    """OpenAI's reasons; a row cut short (shutdown) reports ``length``, as a truncated answer."""
    return FINISH_REASONS.get(summary.stop_reason, "length")


def token_records(events: list[TokenEvent], level: TokenLevel) -> list[dict[str, Any]]:
    if level == "ids":
        return [{"token_id": event.token_id, "prob": event.prob} for event in events]
    return [_full(event) for event in events]


def cached_tokens(summary: Summary) -> int:
    """The prompt's tokens the prompt cache held (0 without one)."""
    return summary.facts.cache.reused if summary.facts.cache is not None else 0


def extension(summary: Summary) -> dict[str, Any]:
    """Our figures of a finished row (the summary record less what the answer already says)."""
    skip = ("type", "text", "tokens", "prompt_tokens", "model")
    return {key: value for key, value in summary.to_dict().items() if key not in skip}


@dataclass
class Answer:
    """One HTTP request's answer being built: ids, the model and what each choice has so far."""

    serve: ServeRequest
    model: str
    system_fingerprint: str
    chat: bool
    token_bytes: Callable[[int], bytes | None]  # each token's own bytes, for logprobs
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    offsets: dict[int, int] = field(default_factory=dict)  # completions: text offset per choice
    templates: dict[int, tuple[str, str]] = field(default_factory=dict)  # plain token chunks per choice
    warned: bool = False  # the ignored keys' warnings went out (a stream's first chunk carries them)
    shape: ChatShape = PLAIN  # chat: the answer's tools and thinking block
    splits: dict[int, StreamSplit] = field(default_factory=dict)  # a stream's per choice, when shaped
    cached: int | None = None  # prompt tokens the prompt cache held (None: the cache is off)

    @property
    def plain(self) -> bool:
        """Token chunks carry nothing but the text (no logprobs, no records of ours, no fields
        but ``content``)."""
        return not self.serve.request.logprobs and self.serve.tokens == "none" and self.shape.plain

    @property
    def object_id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.id

    def _head(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.object_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
        }

    def prompt(self, index: int) -> str:
        """A completion choice's prompt (each prompt of a list has ``n`` choices, in order)."""
        return self.serve.requests[index // self.serve.n].prompt or ""

    def _logprobs(self, events: list[TokenEvent], index: int) -> Any:
        request = self.serve.request
        if not request.logprobs:
            return None
        if self.chat:
            return {"content": _chat_logprobs(events, request.top_logprobs, self.token_bytes)}
        offset = self.offsets.get(index, len(self.prompt(index)))
        self.offsets[index] = offset + sum(len(event.text) for event in events)
        return _completion_logprobs(events, request.top_logprobs, offset)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if self.cached is not None:  # as OpenAI reports its own prompt caching
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return usage

    def count_cached(self, summary: Summary) -> None:
        """A prompt's first choice's reuse of the prompt cache, into ``usage``."""
        if summary.facts.cache is not None:
            self.cached = (self.cached or 0) + cached_tokens(summary)

    def body(self, summaries: list[Summary], events: list[list[TokenEvent]]) -> dict[str, Any]:
        """The whole answer (``stream: false``), choices in index order."""
        choices = []
        for index, (summary, tokens) in enumerate(zip(summaries, events, strict=True)):
            choice: dict[str, Any] = {"index": index}
            called = False
            if self.chat:
                choice["message"], called = message(summary.text, self.shape)
            else:
                choice["text"] = (self.prompt(index) if self.serve.echo else "") + summary.text
            choice["logprobs"] = self._logprobs(tokens, index)
            if self.serve.prompt_logprobs and choice["logprobs"] is not None:  # echo: the prompt's columns first
                choice["logprobs"] = joined_columns(self._prompt_columns(index), choice["logprobs"])
            choice["finish_reason"] = "tool_calls" if called else finish_reason(summary)
            if self.serve.tokens != "none":
                records = token_records(tokens, self.serve.tokens)
                ends = list(zip([e.index for e in tokens], accumulate(len(e.text) for e in tokens), strict=True))
                took_over = self._took_over("".join(event.text for event in tokens), ends)
                choice["llmsample"] = {**extension(summary), **took_over, "tokens": records}
            choices.append(choice)
        completion = sum(summary.tokens for summary in summaries)
        prompt = sum(summary.prompt_tokens for summary in summaries[:: self.serve.n])
        for summary in summaries[:: self.serve.n]:
            self.count_cached(summary)
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": self.usage(prompt, completion), **self._warnings()}

    def _took_over(self, text: str, ends: list[tuple[int, int]]) -> dict[str, Any]:
        """``tool_call_token``: the index of the token a call began at, from ``ends`` (each
        token's index and where its text ends): the call's grammar allowed nothing but the call
        from there on."""
        at = call_start(text, self.shape)
        found = next((index for index, end in ends if end > at), None) if at is not None else None
        return {} if found is None else {"tool_call_token": found}

    def _warnings(self) -> dict[str, Any]:
        """``warnings``: the keys ignored, once per answer (a stream's first chunk)."""
        if self.warned or not self.serve.warnings:
            return {}
        self.warned = True
        return {"warnings": list(self.serve.warnings)}

    def opening(self, choices: int) -> str:
        """What a stream starts with: chat's role chunks, completions' echoed prompts, else ''."""
        if self.chat:
            return "".join(self.chunk(index) for index in range(choices))
        if self.serve.echo:
            return "".join(self._echo_chunk(index) for index in range(choices))
        return ""

    def _prompt_columns(self, index: int) -> dict[str, Any]:
        """A completion choice's prompt scored (``echo`` with ``logprobs``), in the legacy columns."""
        return prompt_columns(self.serve.prompt_logprobs[index // self.serve.n])

    def _echo_chunk(self, index: int) -> str:
        """A stream's echoed prompt, with its tokens' log probabilities when they were scored."""
        if not self.serve.prompt_logprobs:
            return self.text_chunk(index, self.prompt(index))
        logprobs = self._prompt_columns(index)
        return self._sse({"choices": [{"index": index, "text": self.prompt(index), "logprobs": logprobs,
                                       "finish_reason": None}]})  # fmt: skip

    def chunk(self, index: int, event: TokenEvent | None = None, summary: Summary | None = None) -> str:
        """One server-sent event: a choice's opening (chat: the role), a token, or its end."""
        if event is not None and self.plain:
            return self.text_chunk(index, event.text)
        if self.chat and not self.shape.plain and (event is not None or summary is not None):
            return self._shaped_chunk(index, event, summary)
        choice: dict[str, Any] = {"index": index}
        text = event.text if event is not None else ""
        if self.chat:
            choice["delta"] = (
                {"content": text} if event is not None else ({} if summary else {"role": "assistant", "content": ""})
            )
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs([event], index) if event is not None else None
        choice["finish_reason"] = finish_reason(summary) if summary is not None else None
        if self.serve.tokens != "none" and event is not None:
            choice["llmsample"] = {"tokens": token_records([event], self.serve.tokens)}
        elif self.serve.tokens != "none" and summary is not None:
            choice["llmsample"] = extension(summary)
        return self._sse({"choices": [choice]})

    def _shaped_chunk(self, index: int, event: TokenEvent | None, summary: Summary | None) -> str:
        """A token or the end of a chat choice whose text splits into fields: one chunk per
        delta it releases (its logprobs and records on the first), none when it releases
        nothing and carries nothing else."""
        split = self.splits.setdefault(index, StreamSplit(self.shape))
        deltas = split.feed(event.text if event is not None else "", final=summary is not None)
        if event is not None:
            split.ends.append((event.index, len(split.text)))
        extra: dict[str, Any] = {}
        if event is not None and self.serve.request.logprobs:
            extra["logprobs"] = self._logprobs([event], index)
        if event is not None and self.serve.tokens != "none":
            extra["llmsample"] = {"tokens": token_records([event], self.serve.tokens)}
        if event is not None and not deltas and not extra:
            return ""
        chunks = []
        if event is not None and not deltas:
            deltas = [{}]  # a chunk for the logprobs or the record alone
        for i, delta in enumerate(deltas):
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            chunks.append(self._sse({"choices": [{**choice, **(extra if i == 0 else {})}]}))
        if summary is not None:
            reason = "tool_calls" if split.called else finish_reason(summary)
            choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}
            if self.serve.tokens != "none":
                choice["llmsample"] = {**extension(summary), **self._took_over(split.text, split.ends)}
            chunks.append(self._sse({"choices": [choice]}))
        return "".join(chunks)

    def text_chunk(self, index: int, text: str) -> str:
        """A plain token's chunk, the text put into the choice's chunk made once (every token's
        event differs only there): what :meth:`chunk` builds, without a dict and a dump per token."""
        if not self.warned and self.serve.warnings:
            choice = {"index": index, **({"delta": {"content": text}} if self.chat else {"text": text})}
            return self._sse({"choices": [{**choice, "logprobs": None, "finish_reason": None}]})
        template = self.templates.get(index)
        if template is None:
            delta_or_text = {"delta": {"content": _MARK}} if self.chat else {"text": _MARK}
            choice = {"index": index, **delta_or_text, "logprobs": None, "finish_reason": None}
            before, after = self._sse({"choices": [choice]}).split(_encode(_MARK))
            template = self.templates[index] = (before, after)
        return template[0] + _encode(text) + template[1]

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        """``stream_options.include_usage``: the last chunk, no choices, the request's usage."""
        return self._sse({"choices": [], "usage": self.usage(prompt_tokens, completion_tokens)})

    def _sse(self, payload: dict[str, Any]) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        record = {**self._head(obj), **payload, **self._warnings()}
        if self.serve.include_usage and "usage" not in payload:
            record["usage"] = None
        return f"data: {dumps(record)}\n\n"


DONE = "data: [DONE]\n\n"
_MARK = "\x00text\x00"  # where a token's text goes: no text of a chunk's head is this
_encode = json.encoder.encode_basestring  # a string as JSON, as dumps writes it (ensure_ascii=False)
