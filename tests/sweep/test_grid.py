"""A sweep's settings and lines: the --vary grid, presets, a TOML file of named settings, and
whole batch lines (the same seeds under every setting); every mistake one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmsample.errors import UserError
from llmsample.sweep.grid import Setting, parse_vary, plan, read_prompts, settings_of


def test_vary_reads_numbers_flags_and_words() -> None:
    assert parse_vary("temperature=0.6,0.9") == ("temperature", [0.6, 0.9])
    assert parse_vary("top-k=0,40") == ("top_k", [0, 40])
    assert parse_vary("xtc_probability=0.5") == ("xtc_probability", [0.5])


@pytest.mark.parametrize(("given", "words"), [
    ("temprature=0.6", "no sampling key 'temprature'; did you mean temperature?"),
    ("temperature", "expected KEY=V1,V2"),
    ("seed=1,2", "a sweep sets seed itself"),
])  # fmt: skip
def test_a_bad_vary_is_one_line(given: str, words: str) -> None:
    with pytest.raises(UserError, match=words):
        parse_vary(given)


def test_the_grid_is_every_preset_times_every_combination(tmp_path: Path) -> None:
    grid = settings_of([], ["temperature=0.6,1.2", "min_p=0,0.1"], None, "balanced")
    assert [s.name for s in grid] == ["temperature=0.6 min_p=0", "temperature=0.6 min_p=0.1",
                                      "temperature=1.2 min_p=0", "temperature=1.2 min_p=0.1"]  # fmt: skip
    assert grid[1] == Setting("temperature=0.6 min_p=0.1", "balanced", {"temperature": 0.6, "min_p": 0.1})
    both = settings_of(["creative", "precise"], ["top_k=20"], None, "balanced")
    assert [(s.name, s.preset) for s in both] == [("creative top_k=20", "creative"), ("precise top_k=20", "precise")]
    toml = tmp_path / "s.toml"
    toml.write_text('[cool]\ntemperature = 0.5\n[wild]\npreset = "creative"\ntop-p = 0.99\n')
    named = settings_of(["balanced"], [], toml, "balanced")
    assert named == [Setting("balanced", "balanced"), Setting("cool", "balanced", {"temperature": 0.5}),
                     Setting("wild", "creative", {"top_p": 0.99})]  # fmt: skip


def test_nothing_to_sweep_or_a_name_twice_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nothing to sweep"):
        settings_of([], [], None, "balanced")
    with pytest.raises(UserError, match="--vary names temperature twice"):
        settings_of([], ["temperature=1", "temperature=2"], None, "balanced")
    toml = tmp_path / "s.toml"
    toml.write_text("[balanced]\ntemperature = 0.5\n")
    with pytest.raises(UserError, match="two settings are named 'balanced'"):
        settings_of(["balanced"], [], toml, "balanced")
    toml.write_text("[x]\ntemprature = 0.5\n")
    with pytest.raises(UserError, match=r"\[x\]: no sampling key 'temprature'"):
        settings_of([], [], toml, "balanced")


def test_the_lines_are_whole_with_the_same_seeds_under_every_setting() -> None:
    grid = settings_of([], ["temperature=0.6,1.2"], None, "balanced")
    lines = [p.line for p in plan(grid, [{"prompt": "hi"}, {"prompt": "yo", "system": "s"}], range(3, 5),
                                  {"max_tokens": 20})]  # fmt: skip
    assert len(lines) == 2 * 2 * 2 and len({line["custom_id"] for line in lines}) == 8
    first = dict(lines[0])
    assert first.pop("custom_id").startswith("temperature=0.6 | prompt 0 | seed 3 | ")
    assert first == {"prompt": "hi", "preset": "balanced", "max_tokens": 20, "temperature": 0.6, "seed": 3}
    assert [line["seed"] for line in lines[:4]] == [line["seed"] for line in lines[4:]] == [3, 4, 3, 4]
    assert lines[2]["system"] == "s"


def test_a_bad_value_names_its_setting() -> None:
    with pytest.raises(UserError, match="setting 'temperature=-1': temperature"):
        plan(settings_of([], ["temperature=-1"], None, "balanced"), [{"prompt": "hi"}], [0], {})


def test_prompts_carry_no_settings_of_their_own() -> None:
    assert read_prompts([b"plain\n", b'{"prompt": "p", "system": "s"}\n'], "p.txt") == [
        {"prompt": "plain"}, {"prompt": "p", "system": "s"}]  # fmt: skip
    with pytest.raises(UserError, match=r"p\.txt line 1: a sweep's prompts carry no settings"):
        read_prompts([b'{"prompt": "p", "temperature": 0.2}\n'], "p.txt")
    with pytest.raises(UserError, match=r"p\.txt holds no prompt"):
        read_prompts([], "p.txt")


def test_a_lines_id_changes_with_what_it_asks() -> None:
    """A resumed -o file's record counts only for the very same line: -n, a prompt or a key changed
    is a line of its own."""
    grid = settings_of([], ["temperature=0.6"], None, "balanced")

    def ids(prompt: str, base: dict) -> str:
        return plan(grid, [{"prompt": prompt}], [1], base)[0].line["custom_id"]

    assert ids("hi", {"max_tokens": 20}) == ids("hi", {"max_tokens": 20})
    assert len({ids("hi", {"max_tokens": 20}), ids("hi", {"max_tokens": 30}), ids("yo", {"max_tokens": 20})}) == 3
