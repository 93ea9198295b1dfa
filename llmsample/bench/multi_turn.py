"""``llmsample bench --multi-turn``: a chat client's conversation against the server with the
prompt cache and without (``--prompt-cache-mb 0``), side by side in rotating rounds
(:mod:`llmsample.bench.timing`). Each turn resends the whole history, streamed, as chat clients
do; per turn: the time to the first text, ``usage.prompt_tokens`` and
``usage.prompt_tokens_details.cached_tokens``. Without the cache every turn prefills the whole
conversation, so its first token comes later each turn; with it, only the new user turn and the
last reply are prefilled. Each round's conversation opens with its own line, so no round finds
the one before it in the cache."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from llmsample.bench.served import ModelArgs, running_server, stream

CACHE_MB = 256
"""The cached side's prompt cache (``serve``'s default)."""
SYSTEM = ("You are a careful assistant for a team that maintains a Python library. Answer briefly, with code "
          "where it helps, and keep to the library's conventions: type hints, short docstrings, no globals.")  # fmt: skip
TURN = ("Here is the next part of the module we are reviewing, part {n}:\n\ndef part_{n}(values: list[float]) -> "
        "float:\n    total = 0.0\n    for value in values:\n        total += value * {n}\n    return total / "
        "max(len(values), 1)\n\nWhat would you change in part {n}, and why?")  # fmt: skip


@dataclass(frozen=True)
class Turn:
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class MultiTurn:
    """Every round's conversation on each side, ``cached[round][turn]``."""

    turns: int
    tokens: int
    cached: list[list[Turn]]
    cold: list[list[Turn]]

    def growth(self, side: list[list[Turn]]) -> float:
        """The last turn's time to first token over the first's, the median of the rounds."""
        return statistics.median(rounds[-1].ttft_s / rounds[0].ttft_s for rounds in side)

    @property
    def last_turn_ratio(self) -> float:
        """The last turn's time to first token, without the cache over with it (median of rounds)."""
        return statistics.median(c[-1].ttft_s / w[-1].ttft_s for w, c in zip(self.cached, self.cold, strict=True))

    def median_turns(self, side: list[list[Turn]]) -> list[dict[str, Any]]:
        """Per turn: the median time to first token over the rounds, the last round's token counts."""
        return [
            {**asdict(side[-1][t]), "ttft_s": statistics.median(r[t].ttft_s for r in side)} for t in range(self.turns)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"turns": self.turns, "new_tokens": self.tokens, "cache_mb": CACHE_MB,
                "cached": self.median_turns(self.cached), "cold": self.median_turns(self.cold),
                "last_over_first_ttft": {"cached": self.growth(self.cached), "cold": self.growth(self.cold)},
                "last_turn_cold_over_cached": self.last_turn_ratio,
                "rounds": {"cached": [[asdict(t) for t in r] for r in self.cached],
                           "cold": [[asdict(t) for t in r] for r in self.cold]}}  # fmt: skip


def conversation(url: str, turns: int, tokens: int, opening: str) -> list[Turn]:
    """One conversation of ``turns`` turns, greedy, at most ``tokens`` a reply."""
    import asyncio

    messages = [{"role": "system", "content": f"{opening} {SYSTEM}"}]
    figures = []
    for n in range(1, turns + 1):
        messages.append({"role": "user", "content": TURN.format(n=n)})
        body = {"messages": messages, "max_tokens": tokens, "temperature": 0}
        answer = asyncio.run(stream(url, "/v1/chat/completions", body))
        details = answer.usage.get("prompt_tokens_details") or {}
        figures.append(Turn(n, answer.first_s, answer.usage["prompt_tokens"], details.get("cached_tokens", 0)))
        messages.append({"role": "assistant", "content": answer.text})
    return figures


def run_multi_turn_benchmark(
    args: ModelArgs, turns: int, runs: int, tokens: int, log: Callable[[str], None]
) -> MultiTurn:
    """Two servers, one with the prompt cache and one without, warmed; then ``runs`` rounds of a
    conversation on each."""
    from llmsample.bench.timing import rounds

    log("starting llmsample serve with the prompt cache and without")
    with (
        running_server(args, "--prompt-cache-mb", str(CACHE_MB)) as cached,
        running_server(args, "--prompt-cache-mb", "0") as cold,
    ):
        for url in (cached, cold):
            conversation(url, 1, 2, "Warm-up.")
        played = itertools.count(1)

        def side(url: str, name: str) -> Callable[[], list[Turn]]:
            def play() -> list[Turn]:  # both sides of round r open with "Conversation r."
                n = next(played)
                log(f"conversation {n} of {2 * runs}: {turns} turns, {name}")
                return conversation(url, turns, tokens, f"Conversation {(n + 1) // 2}.")

            return play

        with_cache, without = rounds(runs, [side(cached, "prompt cache on"), side(cold, "prompt cache off")])
    return MultiTurn(turns, tokens, with_cache, without)


def table(result: MultiTurn) -> str:
    """Per turn: each side's median time to first token, the prompt and what the cache held."""
    lines = [f"a {result.turns}-turn chat through llmsample serve, {result.tokens} tokens a reply at most, "
             f"median of {len(result.cached)} rounds",
             f"  {'turn':>4} {'prompt':>7} {'cached':>7} {'TTFT cache on':>14} {'TTFT cache off':>15}"]  # fmt: skip
    for on, off in zip(result.median_turns(result.cached), result.median_turns(result.cold), strict=True):
        lines.append(f"  {on['turn']:>4} {on['prompt_tokens']:>7} {on['cached_tokens']:>7} "
                     f"{on['ttft_s']:>12.3f} s {off['ttft_s']:>13.3f} s")  # fmt: skip
    lines.append(f"  last turn over first: cache on {result.growth(result.cached):.2f}x, "
                 f"off {result.growth(result.cold):.2f}x; last turn off / on {result.last_turn_ratio:.2f}x")  # fmt: skip
    return "\n".join(lines)
