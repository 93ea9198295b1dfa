"""A session keeps one row's cache between turns: only what a turn adds is prefilled, and every
reply equals the reply computed from scratch (greedy, float32), whatever the turns did before."""

from __future__ import annotations

import pytest

from llmsample.engine.decode import DecodeOptions
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.row_state import BatchItem
from llmsample.engine.session import Session
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.sampling.config import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0, max_tokens=6)
SAMPLED = SamplingConfig(temperature=0.9, top_p=0.95, max_tokens=6, seed=5)


def turn(session: Session, ids: list[int], cfg: SamplingConfig) -> tuple[list[int], Summary]:
    tokens, summary = [], None
    for _, record in session.turn(BatchItem(0, ids, cfg, RunStats("t", "t", cfg.seed))):
        if isinstance(record, TokenEvent):
            tokens.append(record.token_id)
        elif isinstance(record, Summary):
            summary = record
    assert summary is not None
    return tokens, summary


def scratch(lm, ids: list[int], cfg: SamplingConfig) -> list[int]:
    import torch

    events, _ = run_to_end(generate(lm, torch.tensor([ids]), cfg, RunStats("t", "t", cfg.seed), ignore_eos=True))
    return [e.token_id for e in events]


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED])
def test_turns_reuse_the_cache_and_equal_a_fresh_run(tiny_lm, cfg: SamplingConfig) -> None:
    session = Session(tiny_lm, 256, DecodeOptions(ignore_eos=True))
    conversation = encode_prompt(tiny_lm, "w5 w9 w3 w17", raw=True)[0].tolist()
    expected = len(conversation)
    try:
        for user in ["w4 w8", "w12 w13 w14", "w6"]:
            reply, summary = turn(session, conversation, cfg)
            assert reply == scratch(tiny_lm, conversation, cfg)
            prefilled = summary.facts.cache.prefilled
            # turn 1 prefills the prompt; later turns only the last reply's last token and the new user turn
            assert prefilled == expected
            conversation = conversation + reply
            user_ids = encode_prompt(tiny_lm, user, raw=True)[0].tolist()
            expected = 1 + len(user_ids)  # the reply's last token was never fed
            conversation += user_ids
    finally:
        session.close()


def test_undo_and_branch_are_turns_on_a_shorter_or_other_prefix(tiny_lm) -> None:
    session = Session(tiny_lm, 256, DecodeOptions(ignore_eos=True))
    prompt = encode_prompt(tiny_lm, "w5 w9 w3 w17", raw=True)[0].tolist()
    try:
        reply, _ = turn(session, prompt, GREEDY)
        branched = [*prompt, *reply[:2], 20]  # take token 20 at position 2 of the reply
        again, summary = turn(session, branched, GREEDY)
        assert again == scratch(tiny_lm, branched, GREEDY)
        # it shares len(prompt) + 2 tokens with the cache; a turn feeds two at least (fed_from)
        assert summary.facts.cache.reused == len(prompt) + 1
        undone, summary = turn(session, prompt, GREEDY)  # back to the first prompt
        assert undone == reply and summary.facts.cache.prefilled == 2
    finally:
        session.close()


def test_an_interrupted_turn_starts_the_next_afresh(tiny_lm) -> None:
    session = Session(tiny_lm, 256, DecodeOptions(ignore_eos=True))
    prompt = encode_prompt(tiny_lm, "w5 w9 w3", raw=True)[0].tolist()
    records = session.turn(BatchItem(0, prompt, GREEDY, RunStats("t", "t", None)))
    next(records), next(records)
    records.close()  # Ctrl-C mid-reply
    assert session.cached == []
    reply, summary = turn(session, prompt, GREEDY)
    assert reply == scratch(tiny_lm, prompt, GREEDY) and summary.facts.cache.prefilled == len(prompt)
    session.close()
