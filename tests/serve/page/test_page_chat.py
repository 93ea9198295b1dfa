"""The page as a new user meets it (issue 42): chat mode for a model with a chat template, a
system prompt, every sampler as a control, the end of text shown, earlier turns that keep their
colours and alternatives, markdown built safely, one document to continue, undo of a branch, and
the speed and context in the last line."""

from __future__ import annotations

import json
import struct

import httpx

from llmsample.render.bands import band_for
from llmsample.serve.page import CONTROLS
from tests.serve.page.browser import IMAGE, SCRIPT, ask, hex_of, open_more, tokens, wait_done

NO_EOS = {"logit_bias": {"1": -100}}


def sent_bodies(tab) -> list[dict]:
    """Every completion request the page sends from now on, as JSON."""
    bodies: list[dict] = []
    tab.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("completions") else None)
    return bodies


def test_a_chat_model_opens_in_chat_mode_with_every_sampler_as_a_control(page, page_server, tmp_path) -> None:
    assert f"· page {page_server.url}/" in page_server.log.read_text()  # the start-up line names the page
    assert page.is_checked("input[name=mode][value=chat]")
    assert page.is_visible("#system")
    groups = page.eval_on_selector_all("#groups fieldset legend", "ls => ls.map(l => l.textContent)")
    assert groups == list(dict.fromkeys(control.group for control in CONTROLS))
    open_more(page)  # the common controls show at once, the rest in the closed section
    for control in CONTROLS:
        assert page.is_visible(f"#{control.key}"), control.key
    page.select_option("#preset", "creative")  # a preset sets every control, not only four
    creative = {"temperature": "1", "top_p": "0.95", "min_p": "0.05", "presence_penalty": "0.3", "frequency_penalty": "0.2"}
    for key, value in creative.items():
        assert page.input_value(f"#{key}") == value, key
    shot = page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", shot[16:24])
    assert width >= 600 and height >= 300
    assert page.errors == []


def test_the_system_prompt_and_every_control_go_into_the_request(page) -> None:
    bodies = sent_bodies(page)
    page.fill("#system", "w9 w9")
    open_more(page)
    page.fill("#repetition_penalty", "1.2")  # a range input: fill sets it as a user would
    page.fill("#dry_allowed_length", "3")
    ask(page, "w4", 3, NO_EOS, mode="chat")
    body = bodies[-1]
    assert body["messages"] == [{"role": "system", "content": "w9 w9"}, {"role": "user", "content": "w4"}]
    assert body["repetition_penalty"] == 1.2 and body["dry_allowed_length"] == 3
    assert {control.key for control in CONTROLS} <= set(body)
    assert page.errors == []


def test_the_end_of_text_is_a_token_you_can_hover_and_an_empty_reply_says_why(page) -> None:
    ask(page, "w4", 5, {"logit_bias": {"1": 100}}, mode="chat")  # the end of text, at once
    reply = tokens(page)
    assert len(reply) == 1
    assert page.locator("#reply .tok.eos").count() == 1 and page.is_visible("#reply .tok.eos .mark")
    assert "ended its reply at once" in page.text_content("#meta")
    page.hover("#reply .tok.eos")
    page.wait_for_selector("#tip.open")
    assert page.text_content("#tip").startswith("#0 the end of text p=")
    assert page.errors == []


def test_the_last_line_gives_speed_and_context_use(page, page_server) -> None:
    context = httpx.get(page_server.base + "/models", timeout=30).json()["data"][0]["max_model_len"]
    ask(page, "w5 w6", 4, NO_EOS, mode="complete")
    meta = page.text_content("#meta")
    assert " tok/s · context " in meta
    used, total = meta.split("context ")[1].split(" ")[0].split("/")
    assert int(total) == context and 4 < int(used) < 12  # its prompt (2 words and a BOS) and 4 tokens


def test_earlier_turns_keep_their_colours_and_alternatives(page) -> None:
    ask(page, "w4", 3, NO_EOS | {"seed": 1}, mode="chat")
    first = tokens(page)
    page.fill("#prompt", "w5")
    page.click("#send")
    wait_done(page)
    kept = page.eval_on_selector_all(
        "#transcript .turn.assistant .tok", "spans => spans.map(s => ({text: s.textContent, color: s.style.color}))"
    )
    assert [k["text"] for k in kept] == [t["text"] for t in first]
    assert [hex_of(k["color"]) for k in kept] == [band_for(t["prob"]).hex for t in first]
    page.hover("#transcript .turn.assistant .tok:nth-child(2)")
    page.wait_for_selector("#tip.open")
    assert page.text_content("#tip").startswith("#1 ")
    assert page.locator("#tip button").count() >= 1
    assert page.locator("#tip button:not([disabled])").count() == 0  # branching is for the last reply
    assert page.errors == []


def test_a_branch_can_be_undone(page) -> None:
    ask(page, "w5 w6", 6, NO_EOS | {"seed": 3, "temperature": 1.5}, mode="complete")
    first = tokens(page)
    assert page.is_disabled("#undo")
    page.click("#reply .tok:nth-child(2)")
    page.wait_for_selector("#tip.open")
    page.locator("#tip tr.alt:not(.this) button").first.click()
    wait_done(page)
    assert tokens(page) != first
    page.click("#undo")
    assert tokens(page) == first
    assert page.is_disabled("#undo")
    assert page.errors == []


def test_continue_makes_the_reply_part_of_one_editable_document(page) -> None:
    bodies = sent_bodies(page)
    ask(page, "w5 w6", 3, NO_EOS | {"seed": 4}, mode="complete")
    reply = page.text_content("#reply")
    page.click("#continue")
    wait_done(page)
    assert page.input_value("#prompt") == "w5 w6" + reply  # the document, editable in the box
    assert bodies[-1]["prompt"] == "w5 w6" + reply
    assert len(tokens(page)) == 3
    assert page.errors == []


MARKDOWN = f"# Title\n\nSome **bold** and `code` {IMAGE}\n\n- one\n- two *it*\n\n```\n{SCRIPT}\n```\n> {IMAGE}"


def test_markdown_is_built_from_text_never_as_html(page) -> None:
    page.evaluate("text => markdownInto(document.getElementById('reply-md'), text)", MARKDOWN)
    page.check("#markdown")
    md = "#reply-md"
    assert page.text_content(f"{md} h3") == "Title"
    assert page.text_content(f"{md} strong") == "bold" and page.text_content(f"{md} p code") == "code"
    assert page.eval_on_selector_all(f"{md} ul li", "ls => ls.map(l => l.textContent)") == ["one", "two it"]
    assert page.text_content(f"{md} pre code") == SCRIPT
    assert IMAGE in page.text_content(f"{md} blockquote")
    assert page.locator(f"{md} img, {md} script").count() == 0
    assert page.evaluate("window.pwned") is None
    assert page.errors == []


def test_markdown_of_a_markup_reply_stays_text(page) -> None:
    bias = {"logit_bias": {"30": 60, "31": 60, "1": -100}, "temperature": 0}
    ask(page, "w5", 4, bias, mode="chat")
    page.check("#markdown")
    assert page.is_visible("#reply-md") and not page.is_visible("#reply")
    shown = page.text_content("#reply-md")
    assert shown.count("<script>") + shown.count("<img") == 4
    assert page.locator("#reply-md img, #reply-md script").count() == 0
    assert page.evaluate("window.pwned") is None
    assert json.dumps(page.errors) == "[]"
