"""A saved tokenizer loads by its generic class directly, and as ``AutoTokenizer`` loads it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmsample.models.tokenizer import GENERIC, saved_class, saved_tokenizer

TEXTS = ["hello world", "  spaces\tand\nnew lines ", "ünïcode 東京 🙂", "<bos>special<eos>"]


def test_the_generic_class_loads_directly_as_auto_tokenizer_does(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    assert saved_class(tiny_model_dir) == GENERIC
    with monkeypatch.context() as patch:
        patch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **kw: pytest.fail("went through AutoTokenizer"))
        mine = saved_tokenizer(tiny_model_dir, None)
    theirs = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert type(mine) is type(theirs) is TokenizersBackend and mine.get_vocab() == theirs.get_vocab()
    assert (mine.model_max_length, mine.padding_side, mine.chat_template) == (
        theirs.model_max_length, theirs.padding_side, theirs.chat_template,
    )  # fmt: skip
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert mine(text)["input_ids"] == ids and mine.decode(ids) == theirs.decode(ids)
        assert mine(text, add_special_tokens=False)["input_ids"] == theirs(text, add_special_tokens=False)["input_ids"]
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "all_special_ids"):
        assert getattr(mine, name) == getattr(theirs, name)


@pytest.mark.parametrize("kind", ["another class", "no tokenizer.json", "hub id"])
def test_anything_else_goes_through_auto_tokenizer(
    kind: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    source = tmp_path / "model"
    shutil.copytree(tiny_model_dir, source)
    if kind == "another class":
        saved = json.loads((source / "tokenizer_config.json").read_text())
        (source / "tokenizer_config.json").write_text(json.dumps({**saved, "tokenizer_class": "GPT2Tokenizer"}))
    elif kind == "no tokenizer.json":
        (source / "tokenizer.json").unlink()
    calls = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kw: calls.append((path, kw)))
    config = object()
    saved_tokenizer("someone/some-model" if kind == "hub id" else source, config)
    assert calls == [("someone/some-model" if kind == "hub id" else str(source), {"config": config})]


def test_added_tokens_are_kept_in_the_config_once(tiny_model_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A folder saved without them (a GGUF's kept folder) has them recorded by its first load; a
    later load reads no ``tokenizer.json`` in Python and is the tokenizer the untouched folder gives."""
    import transformers.tokenization_utils_base as base
    from transformers import AutoTokenizer

    source = tmp_path / "model"
    shutil.copytree(tiny_model_dir, source)
    saved = json.loads((source / "tokenizer_config.json").read_text())
    saved.pop("added_tokens_decoder", None)  # transformers writes it or not depending on what it imported before
    (source / "tokenizer_config.json").write_text(json.dumps(saved))
    theirs = AutoTokenizer.from_pretrained(str(source))  # read the untouched way: tokenizer.json's own list
    saved_tokenizer(source, None)
    kept = json.loads((source / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert len(kept) == len(json.loads((source / "tokenizer.json").read_text())["added_tokens"]) > 0
    parsed: list[str] = []
    load = base.json.load
    monkeypatch.setattr(base.json, "load", lambda f, *a, **kw: parsed.append(Path(f.name).name) or load(f, *a, **kw))
    mine = saved_tokenizer(source, None)
    assert "tokenizer.json" not in parsed and parsed
    assert mine.added_tokens_decoder == theirs.added_tokens_decoder and mine.get_vocab() == theirs.get_vocab()
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert mine(text)["input_ids"] == ids and mine.decode(ids) == theirs.decode(ids)
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "all_special_ids"):
        assert getattr(mine, name) == getattr(theirs, name)
