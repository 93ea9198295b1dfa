"""The page at ``/`` in headless Chromium (the system's, driven by playwright) against a real
server: a prompt is typed, tokens stream in coloured by probability, an alternative is clicked
and the text continues from it, and text the model writes as markup stays text."""

from __future__ import annotations

import json

import httpx

from llmsample.render.bands import band_for
from tests.serve.conftest import Server
from tests.serve.page.browser import IMAGE, IMAGE_ID, SCRIPT, SCRIPT_ID, ask, hex_of, set_slider, tokens, wait_done


def test_tokens_stream_coloured_and_an_alternative_branches(page, page_server: Server) -> None:
    presets = page.eval_on_selector_all("#preset option", "options => options.map(o => o.value)")
    assert "creative" in presets
    page.select_option("#preset", "creative")  # a preset moves the sliders to its values
    assert page.input_value("#top_p") == "0.95"
    set_slider(page, "temperature", 1.5)  # and a slider moves on its own
    set_slider(page, "top_k", 0)
    page.fill("#seed", "5")
    ask(page, "w5 w6 w7", 8, {"logit_bias": {"1": -100}})  # no <eos>: every token comes
    first = tokens(page)
    assert len(first) == 8
    for token in first:
        assert 0 < token["prob"] <= 1
        assert hex_of(token["color"]) == band_for(token["prob"]).hex
    assert len({band_for(token["prob"]).label for token in first}) > 1  # varied, not one colour
    assert page.text_content("#meta").startswith("preset creative · seed 5 · 8 tokens")
    assert page.text_content("#reply") == "".join(token["text"] for token in first)

    # The same request straight to the API gives the same text: the page sent what it shows.
    body = {"prompt": "w5 w6 w7", "max_tokens": 8, "seed": 5, "preset": "creative", "temperature": 1.5,
            "top_k": 0, "top_p": 0.95, "min_p": 0.05, "logit_bias": {"1": -100}}  # fmt: skip
    direct = httpx.post(page_server.base + "/completions", json=body, timeout=60).json()
    assert direct["choices"][0]["text"] == page.text_content("#reply")

    page.hover("#reply .tok:nth-child(3)")  # the third token's alternatives, as --html shows them
    page.wait_for_selector("#tip.open")
    assert page.text_content("#tip").startswith("#2 ")
    assert "p=" in page.text_content("#tip") and "entropy" in page.text_content("#tip")
    alternatives = page.locator("#tip tr.alt:not(.this) button")
    assert alternatives.count() >= 1
    chosen = json.loads(alternatives.first.text_content())
    page.hover("#tip")
    alternatives.first.click()
    wait_done(page)
    second = tokens(page)
    assert [t["text"] for t in second[:2]] == [t["text"] for t in first[:2]]  # kept up to the token
    assert second[2]["text"].endswith(chosen) and second[2]["picked"]  # with the space it adds there
    assert len(second) == 8  # the continuation fills the rest of max_tokens
    assert page.text_content("#reply") == "".join(t["text"] for t in second)
    assert page.text_content("#reply") != "".join(t["text"] for t in first)
    assert page.errors == []


def test_chat_branches_from_an_assistant_prefix(page) -> None:
    ask(page, "w4 w9", 6, {"logit_bias": {"1": -100}, "seed": 2}, mode="chat")
    first = tokens(page)
    assert len(first) == 6
    assert "user: w4 w9" in page.text_content("#transcript")
    page.click("#reply .tok:nth-child(2)")  # a tap pins the alternatives open
    page.wait_for_selector("#tip.open")
    alternative = page.locator("#tip tr.alt:not(.this) button").first
    chosen = json.loads(alternative.text_content())
    alternative.click()
    wait_done(page)
    second = tokens(page)
    assert second[0]["text"] == first[0]["text"] and second[1]["text"].endswith(chosen) and second[1]["picked"]
    assert len(second) == 6
    assert page.errors == []


def test_markup_the_model_writes_is_shown_as_text(page) -> None:
    # Greedy with both markup words pushed far above the rest: the reply is made of them, and each
    # step's alternatives list the other one.
    bias = {"logit_bias": {str(SCRIPT_ID): 60, str(IMAGE_ID): 60, "1": -100}}
    set_slider(page, "temperature", 0)
    ask(page, "w5", 4, bias)
    reply = page.text_content("#reply")
    assert reply.count("<script>") + reply.count("<img") == 4
    assert page.locator("#reply script, #reply img, #tip script, #tip img").count() == 0
    page.hover("#reply .tok:nth-child(1)")
    page.wait_for_selector("#tip.open")
    tip = page.text_content("#tip")
    assert json.dumps(SCRIPT) in tip and json.dumps(IMAGE) in tip  # the alternatives, as text
    assert page.locator("#tip img, #tip script").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.errors == []
