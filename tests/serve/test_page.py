"""The page at ``/`` in headless Chromium (the system's, driven by playwright) against a real
server: a prompt is typed, tokens stream in coloured by probability, an alternative is clicked
and the text continues from it, and text the model writes as markup stays text."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmsample.render.bands import band_for
from tests.conftest import save_tiny_llama
from tests.serve.conftest import TEMPLATE, Server, start_server

SCRIPT = "<script>window.pwned=1</script>"
IMAGE = "<img/src=x/onerror=window.pwned=2>"
SCRIPT_ID, IMAGE_ID = 30, 31


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


pytestmark = pytest.mark.skipif(
    chromium() is None, reason="no chromium (make test installs Debian's where apt is available)"
)


def markup_model(path: Path) -> Path:
    """The tiny word-level model whose last two words are markup, so a logit bias makes it write them."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2} | {f"w{i}": i for i in range(3, SCRIPT_ID)}
    vocab |= {SCRIPT: SCRIPT_ID, IMAGE: IMAGE_ID}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = TEMPLATE
    return save_tiny_llama(path, tokenizer, 32, 0, 0.5, 2, 32)


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = markup_model(tmp_path_factory.mktemp("markup"))
    running = start_server(model, tmp_path_factory.mktemp("serve-page") / "stderr", "--batch-size", "4")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, page_server: Server):
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    response = tab.goto(page_server.url + "/")
    assert response.status == 200
    assert "script-src 'nonce-" in response.headers["content-security-policy"]
    tab.errors = errors
    yield tab
    tab.close()


def set_slider(tab, name: str, value: float) -> None:
    tab.eval_on_selector(f"#{name}", "(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }", str(value))


def ask(tab, prompt: str, max_tokens: int, extra: dict, mode: str = "complete") -> None:
    tab.check(f"input[name=mode][value={mode}]")
    tab.click("summary")
    tab.fill("#extra", json.dumps(extra))
    tab.fill("#max_tokens", str(max_tokens))
    tab.fill("#prompt", prompt)
    tab.click("#send")
    wait_done(tab)


def wait_done(tab) -> None:
    tab.wait_for_selector("body[data-state=done], body[data-state=error]")
    assert tab.get_attribute("body", "data-state") == "done", tab.text_content("#status")


def tokens(tab) -> list[dict]:
    return tab.eval_on_selector_all(
        "#reply .tok",
        "spans => spans.map(s => ({text: s.textContent, color: s.style.color, prob: Number(s.dataset.prob),"
        " picked: s.classList.contains('picked')}))",
    )


def hex_of(css: str) -> str:
    """``rgb(r, g, b)`` as ``#rrggbb`` (how the browser reports a colour it was given in hex)."""
    if not css.startswith("rgb"):
        return css
    r, g, b = (int(part) for part in css[css.index("(") + 1 : -1].split(","))
    return f"#{r:02x}{g:02x}{b:02x}"


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
