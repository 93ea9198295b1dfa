"""From the user's text to prompt ids: the chat template, raw completion, the context limit."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from llmsample.errors import UserError
from llmsample.models.loading import LoadedModel


def encode_prompt(
    lm: LoadedModel, prompt: str, system: str | None = None, raw: bool = False, truncate: str = "error", room: int = 0
) -> Tensor:
    """Prompt ids ``[1, n]`` on the model's device: a chat turn through the tokenizer's own
    template when it has one, plain text for completion with ``raw``. A prompt that does not fit
    the context is an error, or loses its oldest tokens with ``truncate="left"`` (keeping ``room``
    positions free for the answer where it can)."""
    return torch.tensor([prompt_id_list(lm, prompt, system, raw, truncate, room)], device=lm.device)


def prompt_id_list(
    lm: LoadedModel, prompt: str, system: str | None = None, raw: bool = False, truncate: str = "error", room: int = 0
) -> list[int]:
    """:func:`encode_prompt`'s ids as a list, with the tokenizer alone: a warm engine encodes a
    command's prompt on its tokenizing thread, where no torch operation may run."""
    if not raw and has_chat_template(lm):
        if not prompt.strip():
            raise UserError("the prompt is empty; pass --prompt TEXT (or --raw to let the model start on its own)")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return _fit_ids(lm, render_messages(lm, messages), truncate, room)
    tokenizer = lm.tokenizer
    ids = tokenizer(prompt)["input_ids"]
    if not ids and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id]
    if not ids:
        raise UserError("the prompt is empty and this tokenizer has no BOS token to start from; pass --prompt TEXT")
    return _fit_ids(lm, ids, truncate, room)


def has_chat_template(lm: LoadedModel) -> bool:
    return bool(getattr(lm.tokenizer, "chat_template", None))


def encode_messages(
    lm: LoadedModel,
    messages: list[dict[str, Any]],
    truncate: str = "error",
    room: int = 0,
    tools: list[dict[str, Any]] | None = None,
) -> Tensor:
    """A whole conversation through the chat template, ready for the assistant's turn."""
    return torch.tensor([message_id_list(lm, messages, truncate, room, tools)], device=lm.device)


def message_id_list(
    lm: LoadedModel,
    messages: list[dict[str, Any]],
    truncate: str = "error",
    room: int = 0,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """:func:`encode_messages`'s ids as a list, with the tokenizer alone (a warm engine's
    tokenizing thread, as :func:`prompt_id_list`)."""
    return _fit_ids(lm, render_messages(lm, messages, tools), truncate, room)


def render_messages(lm: LoadedModel, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The conversation's ids through the chat template, unfitted (``chat`` drops old turns
    itself); ``tools``: the functions the template renders (OpenAI's shape)."""
    if not has_chat_template(lm):
        raise UserError(f"{lm.name} has no chat template for messages; send a plain prompt (raw) instead")
    text = lm.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_exchanges(lm: LoadedModel, messages: list[dict[str, Any]], room: int) -> tuple[list[int], int]:
    """A chat's conversation rendered with ``room`` positions left for the reply, dropping the
    oldest exchanges (each from a user message to the next) after the system message until it
    fits; returns (ids, exchanges dropped). ``chat`` in-process and on a warm engine alike."""
    head = 1 if messages and messages[0].get("role") == "system" else 0
    starts = [i for i in range(head, len(messages)) if messages[i].get("role") == "user"] or [head]
    limit = lm.context_length
    for dropped, start in enumerate(starts):
        ids = render_messages(lm, messages[:head] + messages[start:])
        if not limit or len(ids) + room <= limit:
            return ids, dropped
    raise UserError(  # nothing dropped: the conversation goes on as it was
        f"this message is {len(ids)} tokens with the template, and the context of {lm.name} is "
        f"{limit} ({room} kept for the reply); send a shorter one, or lower max_tokens with /set"
    )


def _fit_ids(lm: LoadedModel, ids: list[int], truncate: str, room: int) -> list[int]:
    limit = lm.context_length
    if limit and len(ids) >= limit:
        if truncate != "left":
            raise UserError(
                f"the prompt is {len(ids)} tokens but {lm.name} has a context of {limit}; "
                "shorten it or pass --truncate left to drop its oldest tokens"
            )
        ids = ids[-max(limit - room, limit // 2) :]
    return ids
