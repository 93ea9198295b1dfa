"""The chat's conversation really keeps its cache: each turn prefills only what it adds (and
what the template re-renders), and every reply equals the reply decoded from scratch on the
whole conversation (greedy, float32), /branch and /undo included."""

from __future__ import annotations

import pytest
import torch

from llmsample.api.local import LocalEngine
from llmsample.chat.slash import resolve_token, run_command
from llmsample.chat.talk import Chat, ChatSettings, Views
from llmsample.commands.explain import chain_table
from llmsample.commands.generate import build_renderers
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import render_messages
from llmsample.engine.session import shared_prefix
from llmsample.errors import UserError
from llmsample.events import RunStats
from llmsample.sampling.config import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0, max_tokens=5)
RENDERING = {"fmt": "text", "no_color": True, "inspect": False, "html": None, "color_by": "sampled"}


def scratch(lm, ids: list[int], cfg: SamplingConfig = GREEDY) -> list[int]:
    events, _ = run_to_end(generate(lm, torch.tensor([ids]), cfg, RunStats("t", "t", 0), ignore_eos=True))
    return [e.token_id for e in events]


@pytest.fixture
def chat(chat_lm):
    views = Views(lambda quiet: build_renderers({**RENDERING, "quiet": quiet}), chain_table)
    talk = Chat(LocalEngine(lambda: chat_lm), "t", GREEDY, ChatSettings("w20 w21", top_n=3, ignore_eos=True, no_color=True), views)
    yield talk
    talk.close()


def test_each_turn_prefills_only_what_it_adds_and_equals_a_fresh_run(chat, chat_lm, capsys) -> None:
    cached: list[int] = []
    for user in ["w7 w8", "w9 w10 w11", "w12", "w13 w14"]:
        reply = chat.say(user)
        prompt = render_messages(chat_lm, chat.conversation.messages()[:-1])
        assert reply.prompt_ids == prompt
        reused = shared_prefix(prompt, cached)
        assert chat.last_summary.facts.cache.reused == reused > (0 if cached else -1)
        assert chat.last_summary.facts.cache.prefilled == len(prompt) - reused
        assert reply.ids == scratch(chat_lm, prompt)
        if cached:  # what was added: the last reply's last token, its end and the new user turn
            assert len(prompt) - reused <= len(render_messages(chat_lm, [{"role": "user", "content": user}])) + 2
        cached = prompt + reply.ids[:-1]
    assert chat.totals.prefilled < sum(len(t.reply.prompt_ids) for t in chat.conversation.turns) / 2
    out = capsys.readouterr()
    assert "cached +" in out.err and "prefilled" in out.err


def test_branch_and_undo_equal_fresh_runs(chat, chat_lm, capsys) -> None:
    chat.say("w7 w8")
    first = chat.say("w9 w10")
    alternative = resolve_token(chat, "#1", first.events[2])
    assert alternative != first.ids[2]
    run_command(chat, "/branch 2 #1")
    branched = chat.conversation.turns[-1].reply
    assert branched.ids[:3] == [*first.ids[:2], alternative]
    assert branched.ids[3:] == scratch(chat_lm, first.prompt_ids + branched.ids[:3])
    # rolled back to position 2 of the reply, and one more: a turn feeds two tokens at least (fed_from)
    assert chat.last_summary.facts.cache.reused == len(first.prompt_ids) + 1
    assert chat.last_summary.facts.cache.prefilled == 2
    run_command(chat, "/undo")
    assert len(chat.conversation.turns) == 1
    again = chat.say("w11")
    prompt = render_messages(chat_lm, chat.conversation.messages()[:-1])
    assert again.prompt_ids == prompt and again.ids == scratch(chat_lm, prompt)
    run_command(chat, "/regen")  # greedy: a new seed, the same reply, all but the last two tokens cached
    assert chat.conversation.turns[-1].reply.ids == again.ids
    assert chat.last_summary.facts.cache.prefilled == 2


def test_a_conversation_past_the_context_drops_its_oldest_turns(chat, chat_lm, monkeypatch, capsys) -> None:
    monkeypatch.setattr(chat_lm.model.config, "max_position_embeddings", 48)
    for user in ["w7 w8 w9", "w10 w11 w12", "w13 w14 w15", "w16 w17 w18", "w19 w22 w23"]:
        chat.say(user)
    assert "dropped the 1 oldest exchange(s) to fit the context of 48 tokens" in capsys.readouterr().err
    messages = chat.conversation.messages()
    assert messages[0] == {"role": "system", "content": "w20 w21"} and messages[1]["content"] != "w7 w8 w9"
    last = chat.conversation.turns[-1].reply
    assert len(last.prompt_ids) + 5 <= 48 and last.ids == scratch(chat_lm, last.prompt_ids)
    with pytest.raises(UserError, match=r"this message is .* tokens"):
        chat.say(" ".join(["w30"] * 60))
    assert chat.conversation.turns[-1].reply is last  # the conversation goes on as it was
