"""Scaling on the command line: --device-map / --max-memory / --offload-folder, --quantize and
--reference, and each refusal in one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from tests.conftest import make_tiny_model, quant_library

BASE = ("generate", "--raw", "-p", "w5 w6 w7", "-n", "8", "--seed", "4", "--ignore-eos", "--format", "jsonl")


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def records(result) -> tuple[list[dict], dict]:
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return lines[:-1], lines[-1]


def one_line_error(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
    assert fragment in result.stderr, result.stderr


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("four"), layers=4, seed=4)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows of 64 weights: what bitsandbytes' CPU 4-bit kernels need at least."""
    return make_tiny_model(tmp_path_factory.mktemp("wide"), hidden=64, init=0.05, seed=6)


def test_an_explicit_device_map_with_disk_offload_gives_the_same_tokens(four_layers: Path, tmp_path: Path) -> None:
    device_map = tmp_path / "map.json"
    layers = {f"model.layers.{i}": "cpu" if i < 2 else "disk" for i in range(4)}
    device_map.write_text(
        json.dumps(
            {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", **layers, "model.norm": "cpu", "lm_head": "disk"}
        )
    )
    plain = invoke(*BASE, "-m", str(four_layers))
    placed = invoke(
        *BASE, "-m", str(four_layers), "--device-map", str(device_map), "--offload-folder", str(tmp_path / "off")
    )
    assert plain.exit_code == 0 == placed.exit_code, placed.output
    (plain_tokens, _), (placed_tokens, summary) = records(plain), records(placed)
    assert [t["token_id"] for t in placed_tokens] == [t["token_id"] for t in plain_tokens]
    assert summary["device_map"] == ["cpu", "disk"]


def test_max_memory_pushes_layers_to_disk(four_layers: Path, tmp_path: Path) -> None:
    plain = invoke(*BASE, "-m", str(four_layers))
    placed = invoke(*BASE, "-m", str(four_layers), "--max-memory", "cpu=60KB", "--offload-folder", str(tmp_path))
    assert placed.exit_code == 0, placed.output
    (plain_tokens, _), (placed_tokens, summary) = records(plain), records(placed)
    assert [t["token_id"] for t in placed_tokens] == [t["token_id"] for t in plain_tokens]
    assert "disk" in summary["device_map"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--max-memory", "cpu:60KB"), "is not DEVICE=SIZE"),
        (("--max-memory", "cpu=lots"), "is not a size"),
        (("--max-memory", "7=1GiB"), "names GPU 7"),
        (("--device-map", "everywhere"), "neither auto"),
        (("--device-map", "auto", "--compile"), "--compile needs the whole model on one device"),
        (("--device-map", "sequential", "--device", "cpu"), "--device cpu and --device-map exclude each other"),
    ],
)
def test_placement_refusals_are_one_line(tiny_model_dir: Path, args: tuple[str, ...], fragment: str) -> None:
    one_line_error(invoke(*BASE, "-m", str(tiny_model_dir), *args), fragment)


def write_map(path: Path, changes: dict[str, object]) -> str:
    """The four-layer model's full map as a file, with entries changed (None: left out)."""
    layers = {f"model.layers.{i}": "cpu" for i in range(4)}
    full = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", **layers, "model.norm": "cpu", "lm_head": "cpu"}
    full.update(changes)
    path.write_text(json.dumps({k: v for k, v in full.items() if v is not None}))
    return str(path)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        # issue 25, 9: a device that does not exist (a traceback from torch, deep in the load)
        ({"model.layers.0": "gpu7"}, "'model.layers.0' maps to 'gpu7', which is no device; use a GPU index"),
        # issue 25, 11: a module left out (it ran, on the CPU), one the model lacks (ignored)
        ({"model.norm": None}, "--device-map gives no device to 'model.norm' of model"),
        ({"model.layers.7": "cpu"}, "--device-map names 'model.layers.7', which model"),
    ],
)
def test_a_device_map_file_that_does_not_fit_is_one_line(
    four_layers: Path, tmp_path: Path, changes: dict, fragment: str
) -> None:
    device_map = write_map(tmp_path / "map.json", changes)
    one_line_error(invoke(*BASE, "-m", str(four_layers), "--device-map", device_map), fragment)


def test_a_device_map_naming_a_gpu_the_machine_lacks_names_the_entry(four_layers: Path, tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() > 9:
        pytest.skip("this machine has a GPU 9")
    device_map = write_map(tmp_path / "map.json", {"model.layers.0": "cuda:9"})
    result = invoke(*BASE, "-m", str(four_layers), "--device-map", device_map)
    one_line_error(result, "--device-map maps 'model.layers.0' to GPU 9, but this machine has")


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """Root ignores permission bits, so a read-only mount is the honest unwritable directory."""
    from tests.batch.tmpfs import tmpfs

    with tmpfs(tmp_path / "ro", "ro", "size=16k") as mount:
        yield mount


def test_an_offload_folder_that_cannot_be_written_is_named(
    four_layers: Path, tmp_path: Path, read_only_dir: Path
) -> None:
    """Issue 25, 12: checked before the load, whether it exists or would be made; the error used
    to blame the model ("cannot load model ... from a local directory or the hub")."""
    (tmp_path / "file").write_text("")
    cases = {
        str(read_only_dir): f"cannot write the offload folder {read_only_dir} (Read-only file system)",
        str(read_only_dir / "new" / "deeper"): "(Read-only file system); choose another folder",
        str(tmp_path / "file" / "off"): f"cannot make {tmp_path / 'file' / 'off'}: {tmp_path / 'file'} is not a dir",
    }
    for folder, fragment in cases.items():
        result = invoke(*BASE, "-m", str(four_layers), "--max-memory", "cpu=60KB", "--offload-folder", folder)
        one_line_error(result, fragment)
        assert "Invalid value for '--offload-folder'" in result.stderr
    assert list(read_only_dir.iterdir()) == [] and sorted(tmp_path.iterdir()) == sorted([tmp_path / "file", read_only_dir])


def test_max_memory_in_plain_bytes(four_layers: Path, tmp_path: Path) -> None:
    """Issue 25, 13: plain bytes, which the README allows, were refused by accelerate's parser."""
    plain = invoke(*BASE, "-m", str(four_layers))
    roomy = invoke(*BASE, "-m", str(four_layers), "--max-memory", "cpu=4000000000")
    tight = invoke(*BASE, "-m", str(four_layers), "--max-memory", "cpu=60000", "--offload-folder", str(tmp_path))
    assert roomy.exit_code == 0 == tight.exit_code, roomy.output + tight.output
    expected = [t["token_id"] for t in records(plain)[0]]
    for result, devices in ((roomy, None), (tight, ["cpu", "disk"])):  # all of it on the CPU: no map to report
        tokens, summary = records(result)
        assert [t["token_id"] for t in tokens] == expected and summary.get("device_map") == devices


def test_compile_with_a_device_map_is_refused_by_speculate_too(tiny_model_dir: Path) -> None:
    result = invoke("speculate", "--raw", "-p", "w5", "-m", str(tiny_model_dir), "--device-map", "auto", "--compile")
    one_line_error(result, "--compile needs the whole model on one device")


@pytest.mark.parametrize(("scheme", "library"), [("int8", "torchao"), ("int4", "bitsandbytes")])
def test_a_missing_quantization_library_names_the_extra(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, library: str
) -> None:
    monkeypatch.setattr("llmsample.models.quantization.library_available", lambda module: module != library)
    result = invoke(*BASE, "-m", str(tiny_model_dir), "--quantize", scheme)
    one_line_error(result, f"--quantize {scheme} needs {library}")
    assert "pip install 'llmsample[quant]'" in result.stderr


def stored_quantized(source: Path, target: Path, method: str) -> Path:
    import shutil

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": 128}
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(("method", "needs"), [("gptq", "gptqmodel and optimum"), ("awq", "gptqmodel")])
def test_a_stored_quantized_checkpoint_without_its_library_is_one_line(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, needs: str
) -> None:
    monkeypatch.setattr("llmsample.models.quantization.library_available", lambda module: False)
    model = stored_quantized(tiny_model_dir, tmp_path / method, method)
    one_line_error(
        invoke(*BASE, "-m", str(model)), f"stored quantized with {method.upper()} (config.json), which needs {needs}"
    )


def test_quantizing_a_quantized_checkpoint_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = stored_quantized(tiny_model_dir, tmp_path / "gptq", "gptq")
    one_line_error(invoke(*BASE, "-m", str(model), "--quantize", "int8"), "is already quantized (gptq")


def test_int8_with_reference_reports_kl_and_same_top(four_layers: Path) -> None:
    quant_library("torchao")
    result = invoke(*BASE, "-m", str(four_layers), "--quantize", "int8", "--reference")
    assert result.exit_code == 0, result.output
    tokens, summary = records(result)
    assert summary["quantization"] == "int8"
    reference = summary["reference"]
    assert reference["dtype"] == "float32" and reference["tokens"] == len(tokens) == 8
    kls = [t["reference"]["kl"] for t in tokens]
    assert all(kl >= 0 for kl in kls) and any(kl > 0 for kl in kls)  # int8 changed something, not much
    assert reference["mean_kl"] == pytest.approx(sum(kls) / len(kls))
    assert reference["same_top"] == pytest.approx(sum(t["reference"]["same_top"] for t in tokens) / len(tokens))
    assert all(0 <= t["reference"]["prob"] <= 1 for t in tokens)
    assert "vs float32: mean KL" in result.stderr


def test_int4_runs_on_this_cpu(wide: Path) -> None:
    quant_library("bitsandbytes")
    result = invoke(*BASE, "-m", str(wide), "--quantize", "int4", "--reference")
    assert result.exit_code == 0, result.output
    tokens, summary = records(result)
    assert summary["quantization"] == "int4" and len(tokens) == 8
    assert summary["reference"]["mean_kl"] > 0


def test_int4_on_rows_its_kernels_cannot_take_is_one_line(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bitsandbytes' CPU 4-bit kernels refuse rows of under 64 weights on some CPUs and take them
    on others (this tiny model's 32 run on an AVX2 machine): the kernel's refusal is planted in
    the model's forward pass, so the check is the same on every machine."""
    quant_library("bitsandbytes")
    from transformers import LlamaForCausalLM

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("rows of at least 64 weights, got 32\nmore detail")

    monkeypatch.setattr(LlamaForCausalLM, "forward", refuse)
    one_line_error(
        invoke(*BASE, "-m", str(tiny_model_dir), "--quantize", "int4"), "--quantize int4 cannot run this model"
    )


def test_a_checkpoint_saved_quantized_loads_as_it_is(four_layers: Path, tmp_path: Path) -> None:
    quant_library("torchao")
    from llmsample.models.loading import load_model

    quantized = load_model(str(four_layers), "cpu", "float32", quantize="int8")
    quantized.model.save_pretrained(tmp_path / "int8")
    quantized.tokenizer.save_pretrained(tmp_path / "int8")
    result = invoke(*BASE, "-m", str(tmp_path / "int8"))
    direct = invoke(*BASE, "-m", str(four_layers), "--quantize", "int8")
    assert result.exit_code == 0 == direct.exit_code, result.output
    assert records(result)[1]["quantization"] == "torchao"
    assert [t["token_id"] for t in records(result)[0]] == [t["token_id"] for t in records(direct)[0]]
    one_line_error(
        invoke(*BASE, "-m", str(tmp_path / "int8"), "--reference"), "--reference needs full-precision weights"
    )


def test_reference_against_itself_is_zero(tiny_model_dir: Path) -> None:
    result = invoke(*BASE, "-m", str(tiny_model_dir), "--reference")
    assert result.exit_code == 0, result.output
    tokens, summary = records(result)
    assert all(t["reference"]["kl"] == 0 and t["reference"]["same_top"] for t in tokens)
    assert [t["reference"]["prob"] for t in tokens] == pytest.approx([t["model_prob"] for t in tokens])
    assert summary["reference"]["same_top"] == 1.0


@pytest.mark.parametrize("draft", [(), ("--draft", "ngram"), ("--draft", "{tiny}")])
def test_reference_scores_speculative_runs_too(tiny_model_dir: Path, draft: tuple[str, ...]) -> None:
    """Speculation samples the plain distribution, so the reference sees the same per-token figures."""
    draft = tuple(a.replace("{tiny}", str(tiny_model_dir)) for a in draft)
    result = invoke(*BASE, "-m", str(tiny_model_dir), "--reference", *draft)
    assert result.exit_code == 0, result.output
    tokens, summary = records(result)
    assert summary["reference"]["tokens"] == len(tokens) == 8
    assert all(t["reference"]["kl"] == 0 and t["reference"]["same_top"] for t in tokens)
    assert [t["reference"]["prob"] for t in tokens] == pytest.approx([t["model_prob"] for t in tokens])


def test_records_without_reference_keep_their_schema(tiny_model_dir: Path) -> None:
    tokens, summary = records(invoke(*BASE, "-m", str(tiny_model_dir)))
    assert "reference" not in tokens[0] and "reference" not in summary and "quantization" not in summary
