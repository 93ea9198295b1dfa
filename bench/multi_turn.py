"""A chat client's conversation against the server, with and without the prompt cache: each turn
resends the whole history through the real ``openai`` client (streamed), as chat clients do.
Time to first token per turn on each side, and ``usage.prompt_tokens_details.cached_tokens``.
Without the cache every turn prefills the whole conversation, so its first token comes later
each turn; with it, only the new user turn and the last reply are prefilled.

    PYTHONPATH=. python bench/multi_turn.py --turns 10 --max-tokens 32

Prints one JSON document (``--out FILE`` also writes it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.serve_load import start_server

SYSTEM = ("You are a careful assistant for a team that maintains a Python library. Answer briefly, with code "
          "where it helps, and keep to the library's conventions: type hints, short docstrings, no globals.")  # fmt: skip
TURN = ("Here is the next part of the module we are reviewing, part {n}:\n\ndef part_{n}(values: list[float]) -> "
        "float:\n    total = 0.0\n    for value in values:\n        total += value * {n}\n    return total / "
        "max(len(values), 1)\n\nWhat would you change in part {n}, and why?")  # fmt: skip


def conversation(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One conversation of ``--turns`` turns; per turn: seconds to the first text, prompt tokens, cached ones."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    turns = []
    for n in range(1, args.turns + 1):
        messages.append({"role": "user", "content": TURN.format(n=n)})
        sent, first, text, usage = time.perf_counter(), None, [], None
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - sent
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None
        details = usage.prompt_tokens_details
        turns.append({"turn": n, "ttft_s": first or 0.0, "prompt_tokens": usage.prompt_tokens,
                      "cached_tokens": details.cached_tokens if details else 0})  # fmt: skip
        print(json.dumps(turns[-1]), file=sys.stderr, flush=True)  # progress: a slow side shows as it goes
        messages.append({"role": "assistant", "content": "".join(text)})
    return turns


def side(args: argparse.Namespace, cache_mb: int) -> list[dict[str, Any]]:
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"multi-turn-{os.getpid()}-{cache_mb}.log"
    proc, url = start_server(args, log, "--prompt-cache-mb", str(cache_mb))
    try:
        conversation(url, argparse.Namespace(**{**vars(args), "turns": 1, "max_tokens": 2}))  # warm-up
        return conversation(url, args)
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", "-m", default=None, help="[default: the default model]")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cached, cold = side(args, args.cache_mb), side(args, 0)
    growth = {name: turns[-1]["ttft_s"] / turns[0]["ttft_s"] for name, turns in (("cached", cached), ("cold", cold))}
    document = {"settings": vars(args) | {"out": str(args.out) if args.out else None}, "cached": cached,
                "cold": cold, "last_over_first_ttft": growth}  # fmt: skip
    text = json.dumps(document, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
