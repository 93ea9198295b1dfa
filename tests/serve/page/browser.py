"""What the page's tests share: the tiny word-level model whose last two words are markup, and
how a test drives the page (the fixtures are in this folder's conftest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import save_tiny_llama
from tests.serve.conftest import TEMPLATE

SCRIPT = "<script>window.pwned=1</script>"
IMAGE = "<img/src=x/onerror=window.pwned=2>"
SCRIPT_ID, IMAGE_ID = 30, 31


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


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


def set_slider(tab, name: str, value: float) -> None:
    tab.eval_on_selector(f"#{name}", "(e, v) => { e.value = v; e.dispatchEvent(new Event('input')); }", str(value))


def ask(tab, prompt: str, max_tokens: int, extra: dict, mode: str = "complete") -> None:
    tab.check(f"input[name=mode][value={mode}]")
    open_more(tab)
    tab.fill("#extra", json.dumps(extra))
    tab.fill("#max_tokens", str(max_tokens))
    tab.fill("#prompt", prompt)
    tab.click("#send")
    wait_done(tab)


def open_more(tab) -> None:
    """The page's one closed section (the rest of the controls, other keys, the API key), opened."""
    if not tab.is_visible("#extra"):
        tab.click("details > summary")


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
