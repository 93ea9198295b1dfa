"""The page at a laptop's size (issue 60): the common controls in sight and the rest in one
closed section, the reply in view after Send and while it streams, dark mode on every control,
and the server's ``warnings`` (a misspelled key) shown beside the reply, as text."""

from __future__ import annotations

import pytest

from llmsample.serve.page import CONTROLS
from tests.serve.page.browser import SCRIPT, ask

COMMON = ("preset", "temperature", "top_p", "min_p", "seed", "max_tokens")
NO_EOS = {"logit_bias": {"1": -100}}
WHITE = "rgb(255, 255, 255)"

# Every token appended to the reply is checked once the script that added it yields: is the
# last one inside the window (to a pixel: scrolling rounds)? A MutationObserver's callback runs then.
WATCH_REPLY = """() => {
  window.outOfSight = []; window.seen = 0;
  new MutationObserver(() => {
    const last = document.querySelector('#reply .tok:last-child');
    if (!last) return;
    window.seen++;
    const box = last.getBoundingClientRect();
    if (box.top < -1 || box.bottom > window.innerHeight + 1) window.outOfSight.push([box.top, box.bottom]);
  }).observe(document.getElementById('reply'), {childList: true});
}"""


@pytest.fixture
def laptop(page):
    page.set_viewport_size({"width": 1280, "height": 800})
    return page


def test_the_common_controls_show_and_the_rest_wait_in_one_closed_section(laptop) -> None:
    for key in COMMON:
        assert laptop.is_visible(f"#{key}"), key
    rest = [control.key for control in CONTROLS if control.key not in COMMON]
    assert rest and not any(laptop.is_visible(f"#{key}") for key in rest)
    assert not laptop.is_visible("#extra") and not laptop.is_visible("#key")
    assert laptop.locator("details").count() == 1
    assert laptop.locator("details[open]").count() == 0
    laptop.click("details > summary")
    assert all(laptop.is_visible(f"#{key}") for key in rest)
    assert laptop.is_visible("#extra") and laptop.is_visible("#key")
    assert laptop.errors == []


def in_view(tab, selector: str) -> bool:
    box = tab.locator(selector).bounding_box()  # relative to the viewport's top left
    return box is not None and box["y"] >= -1 and box["y"] + box["height"] <= 801  # scrolling rounds


def test_the_reply_is_in_view_after_send_and_while_it_streams(laptop) -> None:
    ask(laptop, "w4 w5", 6, NO_EOS | {"seed": 1}, mode="chat")
    assert in_view(laptop, "#reply .tok:first-child"), laptop.evaluate("document.body.scrollHeight")
    # A long prompt above the reply: the page scrolls to it and keeps its newest token in sight.
    long_prompt = "\n".join(f"w{3 + i % 20}" for i in range(60))
    laptop.evaluate(WATCH_REPLY)
    ask(laptop, long_prompt, 40, NO_EOS | {"seed": 2}, mode="complete")
    assert laptop.locator("#reply .tok").count() == 40
    assert laptop.evaluate("window.seen") >= 5  # checked as it streamed (a callback may see several tokens)
    assert laptop.evaluate("window.outOfSight") == []
    assert in_view(laptop, "#reply .tok:last-child")
    assert laptop.errors == []


def test_dark_mode_darkens_every_control(laptop) -> None:
    laptop.emulate_media(color_scheme="dark")
    laptop.click("details > summary")
    for selector in ("#seed", "#max_tokens", "#top_k", "#prompt", "#system", "#preset", "#extra", "#send"):
        style = laptop.eval_on_selector(
            selector, "e => { const s = getComputedStyle(e); return [s.backgroundColor, s.color]; }"
        )
        background, color = style
        assert background != WHITE and _light(color), (selector, style)
        assert not _light(background) or background.endswith(", 0)"), (selector, style)  # dark or see-through
    laptop.emulate_media(color_scheme="light")
    assert laptop.eval_on_selector("#seed", "e => getComputedStyle(e).backgroundColor") == WHITE


def _light(css: str) -> bool:
    """``rgb(r, g, b)`` or ``rgba(...)``: brighter than mid-grey."""
    parts = [float(p) for p in css[css.index("(") + 1 : -1].split(",")[:3]]
    return sum(parts) / 3 > 128


def test_the_servers_warnings_show_beside_the_reply_as_text(laptop) -> None:
    assert not laptop.is_visible("#warnings")
    ask(laptop, "w4", 2, NO_EOS | {"temprature": 0.5, SCRIPT: 1}, mode="chat")
    assert laptop.is_visible("#warnings")
    shown = laptop.text_content("#warnings")
    assert "temprature: ignored (unknown parameter; did you mean 'temperature'?)" in shown
    assert SCRIPT in shown and laptop.locator("#warnings script").count() == 0  # a key is text too
    assert in_view(laptop, "#warnings")
    ask(laptop, "w5", 2, NO_EOS, mode="chat")  # the next answer has none: they go
    assert not laptop.is_visible("#warnings")
    assert laptop.evaluate("window.pwned") is None
    assert laptop.errors == []
