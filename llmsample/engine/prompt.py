"""From the user's text to prompt ids: the chat template, raw completion, the context limit."""

from __future__ import annotations

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
    tokenizer = lm.tokenizer
    if not raw and getattr(tokenizer, "chat_template", None):
        if not prompt.strip():
            raise UserError("the prompt is empty; pass --prompt TEXT (or --raw to let the model start on its own)")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
        if not ids and tokenizer.bos_token_id is not None:
            ids = [tokenizer.bos_token_id]
        if not ids:
            raise UserError("the prompt is empty and this tokenizer has no BOS token to start from; pass --prompt TEXT")
    limit = lm.context_length
    if limit and len(ids) >= limit:
        if truncate != "left":
            raise UserError(
                f"the prompt is {len(ids)} tokens but {lm.name} has a context of {limit}; "
                "shorten it or pass --truncate left to drop its oldest tokens"
            )
        ids = ids[-max(limit - room, limit // 2) :]
    return torch.tensor([ids], device=lm.device)
