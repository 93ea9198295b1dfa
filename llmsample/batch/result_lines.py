"""Finished requests and errors as output lines: ours (``--format jsonl``) and OpenAI Batch's.

Every line is strict JSON (``dumps``: no NaN or infinities, UTF-8 text as is) and one record.
Only finished requests have result records: a summary whose ``stop_reason`` is
``interrupted`` is refused (``ValueError``), so that a killed run leaves nothing half-done
behind and resuming redoes it.

**Ours** (``--format jsonl``): ``custom_id`` and ``line`` (the input line number), then the
fields of the summary ``generate --format jsonl`` prints, without ``"type"`` (``text``,
``tokens`` = the token count, ``prompt_tokens``, ``stop_reason``, ``ttft_s``,
``tokens_per_s``, ``model``, ``preset``, ``seed``, ``elapsed_s`` and any extras). The
per-token data goes under ``per_token`` (not ``tokens``, which is already the count), by level:

- ``none``: no ``per_token`` key;
- ``ids``: ``[{"token_id", "prob"}, ...]``;
- ``full``: every token's ``generate`` JSONL record without ``"type"`` (``index``,
  ``token_id``, ``text``, ``prob``, ``model_prob``, ``model_rank``, ``entropy``, ``top``,
  ``removed``, ``source``, ``eos``).

Errors: ``{"custom_id", "line", "error": {"code", "message"}}`` (``custom_id`` is null when
the line had none that could be read).

**OpenAI** (``--format openai``), the shape of OpenAI's Batch output file:
``{"id": "batch_req_…", "custom_id", "response": {"status_code": 200, "request_id": "req_…",
"body": …}, "error": null}``. The body is a ``chat.completion`` (``choices[0].message``) or,
for raw prompts, a ``text_completion`` (``choices[0].text``), with ``finish_reason`` ``stop``
(EOS or a stop string) or ``length`` (the length limit or the model's context), ``usage`` and
``model`` (the model that ran). ``created`` is the caller's (0 by default) so that files can be
compared. Ids are a digest of the request (everything but its line number): a rerun writes the
same ids, and ``batch_req_``, ``req_`` and ``chatcmpl-``/``cmpl-`` share that digest. Our extras
live under the key ``llmsample``: in the body (``line``, ``stop_reason``, ``preset``, ``seed``,
timings) and, with log probabilities, in each token's entry and each alternative's.

Log probabilities (only when the line asked for them; chat:
``choices[0].logprobs.content[]``, completions: the legacy ``tokens`` / ``token_logprobs`` /
``top_logprobs`` / ``text_offset`` columns) are natural logs of the **raw model's** probability
(``model_prob``: temperature 1, no penalties or filters), as vLLM reports by default: the
sampling distribution gives exactly 0 (log −inf) to every token a filter or a greedy step
removed, which would make the alternatives useless; the sampled ``prob`` is in the extension.
A probability of 0 is written as -9999.0, OpenAI's own floor, since JSON has no infinity. Each
entry's ``token`` is the text that token added to the output (so the tokens concatenate to the
content; a token that completes a split character carries all of it, the one before carries
``""``); ``bytes`` are the token's own, as OpenAI and vLLM give them (a byte-fallback token's
one byte, part of a character: the entries' bytes rebuild the text the model wrote, a stop
string the content leaves out included). Alternatives come in the order of the sampling
distribution with their decoded text (U+FFFD for part of a character) and their own bytes. The
EOS token that ended a run is an entry too (``token`` ``""``, ``bytes`` ``[]``, extension
``"eos": true``): ``usage.completion_tokens`` counts it.

Errors: ``{"id", "custom_id", "response": null, "error": {"code", "message"}}``, the message
starting with ``line N:``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Literal

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.tool_requests import PLAIN, ChatShape, message

if TYPE_CHECKING:  # events.py imports torch; these records are only read here
    from llmsample.events import PromptLogprobs, Summary, TokenEvent

TokenLevel = Literal["none", "ids", "full"]
TokenBytesOf = Callable[[int], bytes | None]
TOKEN_LEVELS: tuple[TokenLevel, ...] = ("none", "ids", "full")
# OpenAI reports a row stopped by the model's context as "length", as a truncated answer.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}
LOGPROB_FLOOR = -9999.0
"""What OpenAI reports for a token of probability 0 (JSON has no -inf)."""


def dumps(record: dict[str, Any]) -> str:
    """One strict JSON line, without the newline; NaN or infinities raise ``ValueError``."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False)


def result_record(
    request: Request, summary: Summary, events: Sequence[TokenEvent], tokens: TokenLevel = "ids"
) -> dict[str, Any]:
    """Our record of one finished request (see the module docstring for the shape)."""
    _check_finished(summary)
    if tokens not in TOKEN_LEVELS:
        raise ValueError(f"tokens level {tokens!r}; choose one of {', '.join(TOKEN_LEVELS)}")
    fields = summary.to_dict()
    del fields["type"]
    record = {"custom_id": request.custom_id, "line": request.line, **fields}
    if tokens == "ids":
        record["per_token"] = [{"token_id": event.token_id, "prob": event.prob} for event in events]
    elif tokens == "full":
        record["per_token"] = [_full(event) for event in events]
    return record


def _full(event: TokenEvent) -> dict[str, Any]:
    """The event's JSONL record without ``type``, in JSON's own types (``top`` as a list)."""
    data = event.to_dict()
    del data["type"]
    return {**data, "top": list(data["top"])}


def error_record(error: RequestError) -> dict[str, Any]:
    """Our record of a line that did not run."""
    return {"custom_id": error.custom_id, "line": error.line, "error": {"code": error.code, "message": error.message}}


def openai_result_record(
    request: Request,
    summary: Summary,
    events: Sequence[TokenEvent],
    *,
    created: int = 0,
    token_bytes: TokenBytesOf | None = None,
    shape: ChatShape = PLAIN,
    prompt: PromptLogprobs | None = None,
) -> dict[str, Any]:
    """OpenAI Batch's output line for one finished request; ``token_bytes``: each token's own
    bytes for ``logprobs`` (the model's :meth:`~llmsample.models.loading.LoadedModel.token_bytes`);
    ``prompt``: a completion's prompt scored (``echo`` with ``logprobs``), its columns first."""
    _check_finished(summary)
    digest = request_digest(request)
    chat = request.endpoint == "chat"
    choice: dict[str, Any] = {"index": 0}
    called = False
    if chat:
        choice["message"], called = message(summary.text, shape, lambda i: f"call_{digest}_{i}")
        content = _chat_logprobs(events, request.top_logprobs, token_bytes) if request.logprobs else None
        choice["logprobs"] = {"content": content} if content is not None else None
    else:
        offset = len(request.prompt or "")
        choice["text"] = ((request.prompt or "") if request.echo else "") + summary.text
        columns = _completion_logprobs(events, request.top_logprobs, offset) if request.logprobs else None
        if columns is not None and prompt is not None:
            columns = joined_columns(prompt_columns(prompt), columns)
        choice["logprobs"] = columns
    choice["finish_reason"] = "tool_calls" if called else FINISH_REASONS[summary.stop_reason]
    extension = {
        k: v for k, v in summary.to_dict().items() if k not in ("type", "text", "tokens", "prompt_tokens", "model")
    }
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + digest,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": summary.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": summary.prompt_tokens,
            "completion_tokens": summary.tokens,
            "total_tokens": summary.prompt_tokens + summary.tokens,
        },
        "llmsample": {"line": request.line, **extension},
    }
    return {
        "id": "batch_req_" + digest,
        "custom_id": request.custom_id,
        "response": {"status_code": 200, "request_id": "req_" + digest, "body": body},
        "error": None,
    }


def openai_error_record(error: RequestError) -> dict[str, Any]:
    """OpenAI Batch's output line for a request that did not run."""
    digest = _digest({"line": error.line, "custom_id": error.custom_id, "error": error.code})
    return {
        "id": "batch_req_" + digest,
        "custom_id": error.custom_id,
        "response": None,
        "error": {"code": error.code, "message": f"line {error.line}: {error.message}"},
    }


def request_digest(request: Request) -> str:
    """Deterministic id material: the same request gives the same ids on every run."""
    fields = dataclasses.asdict(request)
    del fields["line"]  # moving a line within the file does not make it another request
    return _digest(fields)


def _digest(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def _check_finished(summary: Summary) -> None:
    if summary.stop_reason not in FINISH_REASONS:
        raise ValueError(
            f"stop_reason {summary.stop_reason!r}: an unfinished request has no result record "
            "(write nothing for it; resuming redoes it)"
        )


def _logprob(prob: float) -> float:
    """Natural log (capped at 0 against float rounding); OpenAI's -9999 for a probability of 0."""
    return min(math.log(prob), 0.0) if prob > 0 else LOGPROB_FLOOR


def _token_extension(event: TokenEvent) -> dict[str, Any]:
    return {
        "token_id": event.token_id,
        "prob": event.prob,
        "model_prob": event.model_prob,
        "model_rank": event.model_rank,
        "entropy": event.entropy,
        "removed": event.removed,
        "source": event.source,
        "eos": event.eos,
    }


def _chat_logprobs(
    events: Sequence[TokenEvent], top_n: int, token_bytes: TokenBytesOf | None = None
) -> list[dict[str, Any]]:
    """``token_bytes`` None (or None for a token): an entry's bytes are its text's."""

    def own(token: int, text: str, eos: bool = False) -> list[int]:
        if eos:  # the end of text adds nothing to the content
            return []
        found = token_bytes(token) if token_bytes is not None else None
        return list(found if found is not None else text.encode("utf-8"))

    return [
        {
            "token": event.text,
            "logprob": _logprob(event.model_prob),
            "bytes": own(event.token_id, event.text, event.eos),
            "top_logprobs": [
                {
                    "token": candidate.text,
                    "logprob": _logprob(candidate.model_prob),
                    "bytes": own(candidate.token_id, candidate.text),
                    "llmsample": {"token_id": candidate.token_id, "prob": candidate.prob},
                }
                for candidate in event.top[:top_n]
            ],
            "llmsample": _token_extension(event),
        }
        for event in events
    ]


def _completion_logprobs(events: Sequence[TokenEvent], top_n: int, offset: int) -> dict[str, Any]:
    """The legacy columns; ``top_logprobs`` maps text to logprob, so of two alternatives that
    decode alike the likelier one is kept. ``text_offset`` counts characters from the start of
    the prompt, as OpenAI's does."""
    offsets, top = [], []
    for event in events:
        offsets.append(offset)
        offset += len(event.text)
        alternatives: dict[str, float] = {}
        for candidate in event.top[:top_n]:
            alternatives.setdefault(candidate.text, _logprob(candidate.model_prob))
        top.append(alternatives)
    return {
        "tokens": [event.text for event in events],
        "token_logprobs": [_logprob(event.model_prob) for event in events],
        "top_logprobs": top,
        "text_offset": offsets,
        "llmsample": [_token_extension(event) for event in events],
    }


def prompt_columns(prompt: PromptLogprobs) -> dict[str, Any]:
    """An echoed prompt's legacy columns (``echo`` with ``logprobs``), as OpenAI and vLLM give
    them: the first token's ``token_logprobs`` and ``top_logprobs`` null (nothing predicts it),
    every other's alternatives the likeliest (as many as the request asked) and the token itself (a
    dict by text: of two that decode alike the likelier is kept), ``text_offset`` from the start
    of the prompt."""
    offsets = list(accumulate((len(text) for text in prompt.texts), initial=0))[:-1]
    top: list[dict[str, float] | None] = []
    for logprob, alternatives in zip(prompt.logprobs, prompt.top, strict=True):
        if logprob is None:
            top.append(None)
            continue
        by_text: dict[str, float] = {}
        for _, text, value in alternatives:  # the likeliest, then the token itself when not among them
            by_text.setdefault(text, _floored(value))
        top.append(by_text)
    return {
        "tokens": list(prompt.texts),
        "token_logprobs": [None if value is None else _floored(value) for value in prompt.logprobs],
        "top_logprobs": top,
        "text_offset": offsets,
        "llmsample": [
            {"token_id": token, "model_rank": rank, "source": "prompt"}
            for token, rank in zip(prompt.token_ids, prompt.ranks, strict=True)
        ],
    }


def joined_columns(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    """Two runs of legacy columns as one (an echoed prompt's, then the generated tokens')."""
    return {key: first[key] + then[key] for key in first}


def _floored(logprob: float) -> float:
    """OpenAI's -9999 for a log probability of -inf (JSON has no infinity)."""
    return max(logprob, LOGPROB_FLOOR)
