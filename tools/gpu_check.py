"""``make gpu-check``: everything worth knowing the first time a GPU is at hand, in one run.

Steps, each timed and given a status in ``summary.json`` / ``summary.txt`` (the exit status is
non-zero when any step failed):

1. ``versions``: Python and every package against pyproject.toml's minimums, plus torch's CUDA
   build and the device (``environment.json``);
2. ``nvidia-smi``: its report (``nvidia-smi.txt``);
3. ``models``: random-weight checkpoints built from configs (the SmolLM2-135M shape and a ~1B
   Llama shape, bf16 as such models are published) with a word-level tokenizer built in code;
   speed does not depend on the weights' values, and nothing has to be downloaded;
4. ``pytest``: the ``cuda``-marked tests (``tests/test_cuda.py``), run with ``gguf`` made
   unimportable (the GPU machine has none: nothing outside the conversion may need it);
5. per model: ``llmsample bench`` eager and with ``--compile`` against transformers' ``generate``
   in the same process (``bench/*.json``), and batched decoding throughput
   (``llmsample bench``'s batch section, ``decode_batch`` against transformers' left-padded
   batch ``generate``, one full batch per size: ``batch-*.json``).

Runs from the source tree without installing anything. Results go to ``--out``, else ``$OUT``,
else ``bench-results/gpu-check-<timestamp>/``. ``--device cpu`` runs the same steps on tiny
shapes with a few tokens, in well under a minute: the normal test suite runs it that way."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Shapes of real models; the weights are random.
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip
LLAMA_1B = dict(  # Llama 3.2 1B
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(
    vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
)  # fmt: skip


@dataclass(frozen=True)
class Profile:
    """How much to measure: real shapes on CUDA, tiny ones for the CPU rehearsal."""

    shapes: dict[str, dict[str, Any]]
    tokens: int  # new tokens per bench run (64 keeps every bench prompt in one 256-slot compile bucket)
    runs: int
    batch_sizes: tuple[int, ...]
    batch_tokens: int
    budget_s: float  # the whole check, every step included
    pytest_args: tuple[str, ...] = ()


PROFILES = {
    "cuda": Profile({"smollm2-135m": SMOLLM2_135M, "llama-1b": LLAMA_1B}, 64, 2, (1, 8, 32, 64), 64, 470),
    # A rehearsal of the steps, not of the tests: one of them (LLMSAMPLE_TEST_DEVICE=cpu runs them all).
    "cpu": Profile({"tiny": TINY}, 8, 1, (1, 8, 32, 64), 8, 900, ("-k", "live_on_the_device")),
}

# Absent on the GPU machine and not needed by this check (gguf: the default model's conversion only;
# the clients, jsonschema and playwright: peers of the CPU suite's server, constraint and page tests).
OPTIONAL = {"anthropic", "gguf", "jsonschema", "openai", "pexpect", "playwright", "ruff", "scipy", "tomli-w"}


@dataclass
class Step:
    name: str
    status: str = "not run"  # ok | failed | skipped | not run
    seconds: float = 0.0
    detail: str = ""
    files: list[str] = field(default_factory=list)


class Check:
    """Runs steps in order, each caught and timed, within one time budget."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.deadline = time.monotonic() + budget_s
        self.steps: list[Step] = []

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, action: Callable[[Step], None]) -> Step:
        step = Step(name)
        self.steps.append(step)
        if self.remaining() <= 0:
            step.status, step.detail = "failed", "out of time: the check's budget was spent before this step"
            print(f"[gpu-check] {name}: {step.detail}", flush=True)
            return step
        print(f"[gpu-check] {name}…", flush=True)
        start = time.perf_counter()
        try:
            action(step)
            if step.status == "not run":
                step.status = "ok"
        except Exception as exc:
            step.status = "failed"
            step.detail = f"{type(exc).__name__}: {exc}".strip()[:2000]
            (self.out / f"{name}.error.txt").write_text(traceback.format_exc())
            step.files.append(f"{name}.error.txt")
        step.seconds = round(time.perf_counter() - start, 2)
        print(f"[gpu-check] {name}: {step.status} ({step.seconds:.1f} s) {step.detail}".rstrip(), flush=True)
        return step

    def subprocess(self, step: Step, args: list[str], log: str, env: dict[str, str] | None = None) -> None:
        """Run ``args``, its output in ``log``; a non-zero exit or running out of time fails the step."""
        path = self.out / log
        step.files.append(log)
        with path.open("w") as f:
            try:
                done = subprocess.run(
                    args, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env or child_env(),
                    timeout=max(1.0, self.remaining()),
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise RuntimeError(f"out of time after {exc.timeout:.0f} s (the check's budget); see {log}") from exc
        if done.returncode != 0:
            tail = path.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"exit {done.returncode}; see {log}: " + " | ".join(tail))

    def write_summary(self, device: str) -> bool:
        ok = all(step.status in ("ok", "skipped") for step in self.steps)
        document = {
            "ok": ok,
            "device": device,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
            "steps": [step.__dict__ for step in self.steps],
        }
        (self.out / "summary.json").write_text(json.dumps(document, indent=2) + "\n")
        lines = [f"gpu-check on {device}: {'OK' if ok else 'FAILED'}", ""]
        lines += [f"{s.status:8} {s.seconds:7.1f} s  {s.name}  {s.detail}".rstrip() for s in self.steps]
        (self.out / "summary.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        return ok


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    env.update(extra)
    return env


# --- versions -------------------------------------------------------------------------------


def minimums() -> tuple[str, dict[str, str]]:
    """requires-python and ``name>=version`` of every dependency, dev extras included."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found = {}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        name, _, version = re.match(r"([A-Za-z0-9_.-]+)\s*(>=\s*(\S+))?", requirement).groups()
        found[name.lower()] = version or "0"
    return project["requires-python"].removeprefix(">="), found


def version_tuple(text: str) -> tuple[int, ...]:
    """``2.11.0+cu128`` -> (2, 11, 0): enough to compare against a ``>=`` minimum."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def check_versions(step: Step, out: Path, device: str) -> None:
    import torch

    python_min, packages = minimums()
    problems, report = [], {"python": platform.python_version(), "platform": platform.platform(), "packages": {}}
    if version_tuple(platform.python_version()) < version_tuple(python_min):
        problems.append(f"python {platform.python_version()} < {python_min}")
    for name, minimum in packages.items():
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            found = None
        report["packages"][name] = {"found": found, "minimum": minimum}
        if found is None:
            if name not in OPTIONAL:
                problems.append(f"{name} missing (needs >={minimum})")
        elif version_tuple(found) < version_tuple(minimum):
            problems.append(f"{name} {found} < {minimum}")
    report["torch_cuda"] = torch.version.cuda
    report["cuda_available"] = torch.cuda.is_available()
    report["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    if torch.cuda.is_available():
        report["gpu"] = torch.cuda.get_device_name()
        report["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        report["bf16_supported"] = torch.cuda.is_bf16_supported()
    elif device.startswith("cuda"):
        problems.append(f"torch {torch.__version__} sees no CUDA device")
    (out / "environment.json").write_text(json.dumps(report, indent=2) + "\n")
    step.files.append("environment.json")
    absent = sorted(n for n, v in report["packages"].items() if v["found"] is None)
    step.detail = f"torch {torch.__version__}, transformers {report['packages']['transformers']['found']}" + (
        f"; absent (not needed here): {', '.join(absent)}" if absent else ""
    )
    if problems:
        raise RuntimeError("; ".join(problems))


def nvidia_smi(check: Check, step: Step, device: str) -> None:
    if not device.startswith("cuda"):
        step.status, step.detail = "skipped", "--device cpu"
        return
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError("nvidia-smi is not on PATH")
    check.subprocess(step, ["nvidia-smi"], "nvidia-smi.txt")


# --- models ---------------------------------------------------------------------------------


def vocabulary(size: int) -> dict[str, int]:
    """Special tokens, every word of the bench prompts (so they tokenize into real ids), then fillers."""
    from tokenizers.pre_tokenizers import Whitespace

    from llmsample.bench.prompts import PROMPTS

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2}
    for prompt in PROMPTS.values():
        for word, _ in Whitespace().pre_tokenize_str(prompt):
            vocab.setdefault(word, len(vocab))
    for i in range(len(vocab), size):
        vocab[f"w{i}"] = i
    if len(vocab) != size:
        raise ValueError(f"a vocabulary of {size} cannot hold the {len(vocab)} words of the prompts")
    return vocab


def build_model(directory: Path, shape: dict[str, Any], device: str) -> Path:
    """A random-weight Llama of ``shape``, initialised on ``device`` (seconds for 1B on a GPU),
    saved in bf16 with a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel(vocabulary(shape["vocab_size"]), unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<eos>"
    )
    config = LlamaConfig(**shape, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = 1
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# --- batch throughput -----------------------------------------------------------------------


def measure_batches(step: Step, out: Path, name: str, model_dir: Path, device: str, profile: Profile) -> None:
    """``llmsample bench``'s batch section (``llmsample.bench.batch_sizes``: ``decode_batch`` against
    transformers' left-padded batch ``generate``, greedy, EOS ignored) with one full batch per
    size: B prompts at batch size B. (``bench --batch-sizes`` decodes a fixed queue of 32 prompts
    at every size: batch 64 would hold 32 rows, and batch 1 would take 32 sequential runs.)"""
    import torch

    from llmsample.bench.batch_sizes import rows_to_dict, run_batch_benchmark
    from llmsample.bench.results import machine_info
    from llmsample.models.device import dtype_name
    from llmsample.models.loading import load_model

    lm = load_model(str(model_dir), device, "auto")
    try:
        rows = [
            row
            for size in profile.batch_sizes
            for row in run_batch_benchmark(lm, None, [size], runs=profile.runs, tokens=profile.batch_tokens, count=size)
        ]
        document = {"kind": "bench-batch", "model": name, "device": str(lm.device), "dtype": dtype_name(lm.dtype),
                    "machine": machine_info().__dict__, "prompts": "one full batch per size",
                    "new_tokens": profile.batch_tokens, "runs": profile.runs, "rows": rows_to_dict(rows)}  # fmt: skip
    finally:
        del lm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    path = out / f"batch-{name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    step.files.append(path.name)
    step.detail = "; ".join(
        f"b{r.batch_size} {r.ours_tok_s:.0f} vs {r.reference_tok_s:.0f} tok/s ({r.ratio:.2f}x)" for r in rows
    )


# --- the check ------------------------------------------------------------------------------

NO_GGUF = (
    "import sys; sys.modules['gguf'] = None\n"  # makes `import gguf` fail, as on a machine without it
    "import llmsample.cli, llmsample.bench.single, llmsample.engine.continuous_batch, llmsample.models.loading\n"
    "import llmsample.models.gguf_to_hf, llmsample.models.compiled, llmsample.models.attention\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)


def bench_summary(out: Path, before: set[Path]) -> tuple[list[str], str]:
    new = sorted(set((out / "bench").glob("*.json")) - before)
    if not new:
        raise RuntimeError("llmsample bench wrote no results")
    figures = json.loads(new[-1].read_text())
    ratios = [row["ratio"] for row in figures["generate"]]
    detail = (
        f"{figures['dtype']}: median {statistics.median(r['ours_tok_s'] for r in figures['generate']):.0f} tok/s, "
        f"ratio {min(ratios):.2f}-{max(ratios):.2f}"
    )
    if figures.get("compile_s"):
        detail += f", compile {figures['compile_s']:.0f} s"
    return [str(p.relative_to(out)) for p in new], detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (tiny shapes, few tokens)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: $OUT, else bench-results/)")
    args = parser.parse_args(argv)
    device = args.device
    profile = PROFILES["cuda" if device.startswith("cuda") else "cpu"]
    out = args.out or Path(
        os.environ.get("OUT") or REPO / "bench-results" / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    )
    out.mkdir(parents=True, exist_ok=True)
    print(f"[gpu-check] device {device}, results in {out}", flush=True)
    check = Check(out, profile.budget_s)
    python = sys.executable

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        # The models stay out of the results folder (it travels back); so does inductor's cache
        # (LLMSAMPLE_HOME's, kept: a later check compiles the same graphs from it in seconds).
        check.run("versions", lambda step: check_versions(step, out, device))
        check.run("nvidia-smi", lambda step: nvidia_smi(check, step, device))
        models: dict[str, Path] = {}

        def build(step: Step) -> None:
            for name, shape in profile.shapes.items():
                models[name] = build_model(Path(scratch) / name, shape, device)
            step.detail = ", ".join(models)

        check.run("models", build)
        pytest_args = ["tests/test_cuda.py", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
                       f"--junitxml={out / 'pytest-cuda.xml'}", *profile.pytest_args]  # fmt: skip

        def tests(step: Step) -> None:
            step.files.append("pytest-cuda.xml")
            check.subprocess(step, [python, "-c", NO_GGUF, *pytest_args], "pytest-cuda.log",
                             child_env(LLMSAMPLE_TEST_DEVICE=device))  # fmt: skip
            report = (out / "pytest-cuda.log").read_text().strip().splitlines()[-1]
            step.detail = report.strip("= ")
            if "skipped" in report and device.startswith("cuda"):
                raise RuntimeError(f"CUDA tests skipped: {step.detail}")

        check.run("pytest", tests)
        for name, model_dir in models.items():  # most wanted first: the budget may run out at the end
            for mode in ("eager", "batch", "compile"):
                if mode == "batch":
                    check.run(
                        f"batch-{name}",
                        lambda step, n=name, d=model_dir: measure_batches(step, out, n, d, device, profile),
                    )
                    continue

                def bench(step: Step, model_dir: Path = model_dir, label: str = mode, name: str = name) -> None:
                    before = set((out / "bench").glob("*.json"))
                    args = [python, "-m", "llmsample", "bench", "--model", str(model_dir), "--device", device,
                            "--runs", str(profile.runs), "--tokens", str(profile.tokens), "--no-cold",
                            "--out", str(out / "bench")] + (["--compile"] if label == "compile" else [])  # fmt: skip
                    check.subprocess(step, args, f"bench-{label}-{name}.log")
                    files, step.detail = bench_summary(out, before)
                    step.files += files

                check.run(f"bench-{mode}-{name}", bench)
    return 0 if check.write_summary(device) else 1


if __name__ == "__main__":
    sys.exit(main())
