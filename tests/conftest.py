"""Fixtures: tiny random Llama models built on the spot, an isolated user directory, and the
real default model (converted once into a cache kept between test runs)."""

from __future__ import annotations

import functools
import importlib
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["tests.tiers"]  # the slow, model and llamacpp markers, applied from what a test uses


def pytest_configure(config: pytest.Config) -> None:
    """CI must not depend on luck: property tests draw the same examples on every run there
    (``CI=true make test``); locally they keep exploring new ones."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


# A suite started in the background (``make test &``, a non-interactive shell's ``&``) inherits
# SIGINT ignored, and every CLI it starts would inherit that too: the Ctrl-C tests would then see
# the signal ignored (rightly: a background job keeps ignoring it). They test the CLI as a
# terminal starts it, so the suite's own process takes Python's default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent
TEST_HOME = REPO / ".test-home"
# Processes started outside a test (session and module fixtures) log their runs here, not in the user's log.
os.environ["XDG_DATA_HOME"] = str(TEST_HOME / "data")

# The CLI's ``--backend auto`` pinned to transformers for the whole session (servers and other
# processes that session fixtures start too): on a CPU it runs the default model on llama.cpp,
# and the tests of auto's own choice unset it.
os.environ["LLMSAMPLE_BACKEND"] = "transformers"


def quant_library(name: str) -> Any:
    """``pytest.importorskip`` for the quant extra's libraries (torchao, bitsandbytes), except
    under ``make test``, which installs the extra and sets ``LLMSAMPLE_REQUIRE_QUANT=1``: there a
    missing library fails the test, so the quantization paths cannot silently go untested."""
    if os.environ.get("LLMSAMPLE_REQUIRE_QUANT") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


def make_tiny_model(
    path: Path,
    vocab_size: int = 32,
    seed: int = 0,
    init: float = 0.5,
    layers: int = 2,
    hidden: int = 32,
    positions: int = 1024,
) -> Path:
    """A random LlamaForCausalLM with a word-level tokenizer (``<bos>``, ``<eos>``, ``<unk>``, w3…),
    saved with safetensors: everything a real checkpoint directory has, in milliseconds."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    return save_tiny_llama(path, tokenizer, vocab_size, seed, init, layers, hidden, positions)


def with_chat_template(path: Path, template: str) -> Path:
    """The model at ``path`` with ``template`` as its tokenizer's chat template (saved in place)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return path


def save_tiny_llama(
    path: Path, tokenizer, vocab_size: int, seed: int, init: float, layers: int, hidden: int, positions: int = 1024
) -> Path:
    """A random LlamaForCausalLM (ids 0/1 are BOS/EOS) saved with ``tokenizer``: any tiny model's body."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=init,  # large weights: peaked, tie-free distributions
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def with_context(path: Path, context: int) -> Path:
    """The model saved at ``path`` with a context of ``context`` positions (Llama computes any
    position, so only the config says where the model's context ends)."""
    import json

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config["max_position_embeddings"] = context
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def load_plain(*args: Any, **kwargs: Any) -> Any:
    """``load_model`` with the weights left as transformers loads them (no oneDNN reordering): the
    kernels of a placed or split model, for tests that compare such a model bit for bit."""
    from llmsample.models import prepacked
    from llmsample.models.loading import load_model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prepacked, "prepacks", lambda device, dtype: False)
        return load_model(*args, **kwargs)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir: Path):
    from llmsample.models.loading import load_model

    return load_model(str(tiny_model_dir), "cpu", "float32")


@functools.cache
def runtime_dir() -> str:
    """The suite's own engine directory: short (a Unix socket's path holds 107 bytes at most)."""
    return tempfile.mkdtemp(prefix="llmsample-run-")


def worker_threads() -> int | None:
    """Under pytest-xdist, each worker's share of this machine's CPUs (None outside xdist). torch,
    and llama.cpp with as many threads as torch, would otherwise each take every CPU: two workers
    on two CPUs then oversubscribe them, and llama.cpp's spinning threads waited on each other
    (a run of the llama.cpp, speculation and placement modules on 2 workers: 150 s, 25 s shared)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(1, int(workers)))


@pytest.fixture(autouse=True)
def shared_cpus() -> None:
    """Each test starts on its worker's share of the CPUs (:func:`worker_threads`), whatever the
    test before it left (a test of threading sets its own count)."""
    threads = worker_threads()
    if threads is None:
        return
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def isolated_user_dirs(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or writes the real user's presets or run log; the model cache is the test cache."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    # The run log (llmsample logs): on, the test's own, and beside tmp_path (tests list what they wrote there).
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
    monkeypatch.setenv("LLMSAMPLE_HOME", str(TEST_HOME))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime_dir())  # no test finds the real user's warm engines
    for inherited in ("LLMSAMPLE_HOST", "LLMSAMPLE_LOGS", "LLMSAMPLE_NO_LOG", "COLUMNS"):
        monkeypatch.delenv(inherited, raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.fixture(scope="session")
def default_lm():
    """The real SmolLM2-135M-Instruct (float32, so answers do not depend on bf16 kernels)."""
    from llmsample.models.loading import load_model

    os.environ["LLMSAMPLE_HOME"] = str(TEST_HOME)
    return load_model(None, "cpu", "float32")


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for subprocess runs of the CLI: the test cache, offline, no colour settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(LLMSAMPLE_HOME=str(TEST_HOME), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    threads = worker_threads()
    if threads is not None:  # the process computes on its worker's share too (torch; llama.cpp takes torch's)
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra)
    return env
