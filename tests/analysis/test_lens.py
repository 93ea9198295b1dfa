"""``explain --layers`` (the logit lens) and ``explain --tree``: the last layer's reading is the
model's own logits to the bit, every other layer is its hidden state through the final norm and
the head by hand, the tree's probabilities are teacher-forced ones multiplied along each path,
model text on the page is escaped, and bad bounds or clashing views are one line (exit 2)."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.analysis.lens_records import explain_layers
from llmsample.cli import main
from llmsample.engine.forcing import forced_logits
from llmsample.engine.logit_lens import layer_logits
from llmsample.engine.tree import continuation_tree
from llmsample.errors import RuntimeFailure, UserError
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import sampling_probs
from tests.conftest import make_tiny_model, save_tiny_llama

PROMPT = [0, 3, 9, 12, 9]


@pytest.fixture(scope="module")
def deep_lm(tmp_path_factory: pytest.TempPathFactory):
    """Four layers: enough readings that the middle ones are neither the first nor the last."""
    from llmsample.models.loading import load_model

    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("deep"), layers=4)), "cpu", "float32")


def test_the_last_layer_is_the_models_own_logits_to_the_bit(deep_lm) -> None:
    lens = layer_logits(deep_lm, PROMPT)
    with torch.inference_mode():
        out = deep_lm.model(torch.tensor([PROMPT]), output_hidden_states=True)
    assert lens.shape == (5, 32) and lens.dtype == torch.float32
    assert torch.equal(lens[-1], out.logits[0, -1].float())
    assert torch.equal(lens[-1], forced_logits(deep_lm, PROMPT)[0])  # what explain's chain reads
    # The others: the embeddings and each layer's output (hidden_states' last entry is already
    # normed, so only the ones before it) through the final norm and the head, by hand.
    base, head = deep_lm.model.model, deep_lm.model.lm_head
    with torch.inference_mode():
        by_hand = torch.stack([head(base.norm(h[0, -1])).float() for h in out.hidden_states[:-1]])
    torch.testing.assert_close(lens[:-1], by_hand, rtol=0, atol=1e-5)
    assert not torch.allclose(lens[0], lens[-1], atol=1e-2)  # the readings differ: not one row repeated


def test_ranks_and_probabilities_per_layer_and_the_chosen_token(deep_lm) -> None:
    ids = torch.tensor([PROMPT])
    lens = layer_logits(deep_lm, PROMPT)
    report = explain_layers(deep_lm, ids, SamplingConfig(), top_n=4)
    top = lens[-1].argmax().item()
    assert report.layers == 4 and report.chosen == top and report.tokens[0].token_id == top
    assert [t.token_id for t in report.tokens] == lens[-1].topk(4).indices.tolist()
    for token in report.tokens:
        for i, row in enumerate(lens):
            assert token.ranks[i] == 1 + sum(1 for v in row.tolist() if v > row[token.token_id].item())
            assert token.probs[i] == pytest.approx(row.softmax(-1)[token.token_id].item(), abs=1e-7)
    assert report.tokens[0].ranks[-1] == 1
    at = report.settles_at()
    assert at is not None and all(r == 1 for r in report.tokens[0].ranks[at:])
    assert at == 0 or report.tokens[0].ranks[at - 1] > 1
    # A ban of the model's top: the preset's choice is another token, not rank 1 at the end.
    banned = explain_layers(deep_lm, ids, SamplingConfig(ban=(deep_lm.token_text(top),)), top_n=4)
    assert banned.chosen != top and banned.tokens[0].ranks[-1] > 1 and banned.settles_at() is None
    assert top in [t.token_id for t in banned.tokens]  # still shown, as an alternative


def test_after_a_continuation_the_preset_sees_it_as_written(deep_lm) -> None:
    """``--layers --continuation``: the lens after the prompt and the text, the chosen token the
    preset's given the text as generated tokens (a repetition penalty on them changes it)."""
    cfg = SamplingConfig(repetition_penalty=50.0, frequency_penalty=2.0)
    ids = torch.tensor([PROMPT])
    changed = 0
    for fed in ([t] for t in range(3, 32)):
        lens = layer_logits(deep_lm, PROMPT + fed)
        report = explain_layers(deep_lm, ids, cfg, top_n=3, fed=fed)
        history = TokenHistory.start(ids, 32).advanced(torch.tensor(fed))
        assert report.chosen == sampling_probs(lens[-1:], history, cfg)[0].argmax().item()
        assert report.tokens[1].probs == lens.softmax(-1)[:, report.tokens[1].token_id].tolist()
        changed += report.chosen != lens[-1].argmax().item()
    assert changed  # the penalty decided at least once


def test_a_backend_without_layers_is_refused_and_closed(deep_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = []

    class Plain:
        layers = None  # declared: it reads no layers

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr("llmsample.engine.logit_lens.open_backend", lambda *args, **kwargs: Plain())
    with pytest.raises(UserError, match="--layers reads the layers on the padded batch"):
        layer_logits(deep_lm, PROMPT)
    assert closed == [True]


def test_a_head_the_lens_cannot_reproduce_fails_in_one_line(deep_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head that does more than norm and a linear map (a soft cap, say) is caught, not shown."""
    from llmsample.models import lens_readout as lens

    real = lens.read_out
    monkeypatch.setattr(lens, "read_out", lambda model, streams: real(model, streams) * 2)
    with pytest.raises(RuntimeFailure, match="does more than its final norm"):
        layer_logits(deep_lm, PROMPT)


def walk(branches, path=()):
    for branch in branches:
        yield (*path, branch.token_id), branch
        yield from walk(branch.children, (*path, branch.token_id))


def test_the_tree_is_teacher_forced_probabilities_multiplied(deep_lm) -> None:
    tree = continuation_tree(deep_lm, PROMPT, depth=3, width=2)
    nodes = list(walk(tree))
    assert len(nodes) == 2 + 4 + 8
    for path, branch in nodes:
        forced = forced_logits(deep_lm, PROMPT, list(path[:-1]))[-1].softmax(-1)
        assert branch.prob == pytest.approx(forced[path[-1]].item(), abs=1e-5)
        siblings = forced.topk(2).indices.tolist()
        assert path[-1] in siblings  # the width most likely after the path
        chain = math.prod(forced_logits(deep_lm, PROMPT, list(path[:-1])).softmax(-1)[i, t].item()
                          for i, t in enumerate(path))  # fmt: skip
        assert branch.path_prob == pytest.approx(chain, rel=1e-4)
        assert bool(branch.children) == (len(path) < 3)
        assert branch.text == deep_lm.token_text(path[-1])
    for parent in [b for _, b in nodes if b.children]:
        assert [c.prob for c in parent.children] == sorted((c.prob for c in parent.children), reverse=True)


def cli(*args: str):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "80"})


def test_the_cli_views_jsonl_and_80_columns(tiny_model_dir: Path) -> None:
    base = ["explain", "-m", str(tiny_model_dir), "--raw", "-p", "w3 w4", "-q"]
    table = cli(*base, "--layers")
    assert table.exit_code == 0, table.output
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    assert re.search(r"^\s+emb\s", table.stdout, re.M) and "rank 1 from" in table.stdout
    record = json.loads(cli(*base, "--layers", "--format", "jsonl", "--top-n", "3", "--watch", "w5").stdout)
    assert record["type"] == "layers" and record["layers"] == 2
    assert [len(t["ranks"]) for t in record["tokens"]] == [3] * 4 and record["tokens"][-1]["text"] == "w5"
    after = json.loads(cli(*base, "--layers", "--continuation", "w5 w6", "--format", "jsonl").stdout)
    assert after["tokens"] != record["tokens"][: len(after["tokens"])]  # another position
    tree = json.loads(cli(*base, "--tree", "2", "--tree-width", "2", "--format", "jsonl").stdout)

    assert tree["type"] == "tree" and [len(b["children"]) for b in tree["branches"]] == [2, 2]
    shown = cli(*base, "--tree", "2", "--tree-width", "2")
    assert shown.exit_code == 0 and all(b["text"] in shown.stdout for b in tree["branches"])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--tree", "0"], "0 is not in the range 1<=x<=6"),
        (["--tree", "7"], "7 is not in the range 1<=x<=6"),
        (["--tree", "2", "--tree-width", "6"], "6 is not in the range 1<=x<=5"),
        (["--tree", "4", "--tree-width", "5"], "625 leaves, more than 256"),
        (["--layers", "--tree", "2"], "--tree is a view of its own"),
        (["--continuation", "w5", "--tree", "2"], "--tree is a view of its own"),
        (["--tree", "2", "--watch", "w5"], "not in --continuation's or --tree's"),
        (["--continuation", "w5", "--watch", "w5"], "not in --continuation's or --tree's"),
        (["--html", "out.html"], "--html draws --layers or --tree"),
    ],
)
def test_user_errors_are_one_line(args: list[str], fragment: str, tiny_model_dir: Path) -> None:
    result = cli("explain", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-q", *args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr


def test_layers_on_llama_cpp_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    missing = tmp_path / "never-read.gguf"  # no such file: the refusal comes first
    result = cli("explain", "-m", str(missing), "--backend", "llama.cpp", "--layers", "-p", "w3", "-q")
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and "--backend transformers" in result.stderr, result.stderr


@pytest.fixture(scope="module")
def markup_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose tokens are HTML: every one of them is among the candidates shown."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = ["<bos>", "<eos>", "<unk>", "<script>", "&amp;", '"q"', "</td>", "plain"]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                        unk_token="<unk>")  # fmt: skip
    return save_tiny_llama(tmp_path_factory.mktemp("markup"), tokenizer, len(words), 0, 0.5, 2, 32)


@pytest.mark.parametrize("view", [["--layers", "--top-n", "8"], ["--tree", "2", "--tree-width", "5"]])
def test_the_page_escapes_model_text(view: list[str], markup_model: Path, tmp_path: Path) -> None:
    page = tmp_path / "view.html"
    args = ["explain", "-m", str(markup_model), "--raw", "-p", "plain <script>", "-q", "--html", str(page)]
    result = cli(*args, *view, "--format", "jsonl")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    texts = {t["text"] for t in record.get("tokens", [])} | {b["text"] for b in record.get("branches", [])}
    assert {"<script>", "</td>", "&amp;"} & texts
    parsed = Page()
    parsed.feed(page.read_text(encoding="utf-8"))
    assert "script" not in parsed.tags and parsed.depth == 0  # no tag of the model's; every one closed
    for text in texts:  # each token's text read back as text
        assert any(text in data for data in parsed.data), text


class Page(HTMLParser):
    """The tags a page opens (and how many are left open) and its text, entities decoded."""

    VOID = frozenset({"meta", "br"})

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.data: list[str] = []
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        self.depth += tag not in self.VOID

    def handle_endtag(self, tag: str) -> None:
        self.depth -= 1

    def handle_data(self, data: str) -> None:
        self.data.append(data)
