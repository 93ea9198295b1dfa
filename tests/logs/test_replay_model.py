"""Which model ``generate --replay`` loads for a logged run: the default model (logged by its
name) as the default, on llama.cpp without the float dtype its summary reports; a local folder
as logged; a folder that has since gone is one line saying how to go on. In process: the run
handed to the decoding is captured, nothing is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.commands import generate
from llmsample.logs import store
from llmsample.models.gguf_to_hf import DEFAULT_MODEL


def keep(model: str, backend: str, dtype: str) -> int:
    facts = {"dtype": dtype, "device": "cpu"}
    run = store.LoggedRun("generate", model, backend, "balanced", 7, "w3", None, {"seed": 7}, "w4", "length", 1,
                          {"facts": facts}, [], flags={"raw": True})  # fmt: skip
    return store.add(run)


def replayed(run_id: int, monkeypatch: pytest.MonkeyPatch):
    """The options the replay would decode with (None: refused), and the CLI's result."""
    seen: list[dict[str, Any]] = []
    monkeypatch.delenv("LLMSAMPLE_BACKEND", raising=False)  # the suite's pin would win over the logged backend
    monkeypatch.setattr(generate, "run", lambda options, asked, check: seen.append(options))
    result = CliRunner().invoke(main, ["generate", "--replay", str(run_id)])
    return (seen[0] if seen else None), result


@pytest.mark.parametrize(("backend", "dtype"), [("llama.cpp", "float32"), ("transformers", "bfloat16")])
def test_a_default_model_run_replays_on_the_default_model(
    monkeypatch: pytest.MonkeyPatch, backend: str, dtype: str
) -> None:  # fmt: skip
    options, result = replayed(keep(DEFAULT_MODEL, backend, dtype), monkeypatch)
    assert result.exit_code == 0, result.output
    assert options is not None and options["model"] is None and options["backend"] == backend
    assert options["dtype"] == ("auto" if backend == "llama.cpp" else dtype)  # llama.cpp: the GGUF's own weights


def test_a_local_folder_replays_as_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    options, result = replayed(keep(str(tmp_path), "torch", "float32"), monkeypatch)
    assert result.exit_code == 0 and options is not None and options["model"] == str(tmp_path), result.output


def test_a_folder_that_has_gone_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "my-finetune"
    run_id = keep(str(gone), "torch", "float32")
    options, result = replayed(run_id, monkeypatch)
    assert options is None and result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr == (f"Error: run {run_id} ran on {gone}, which is no longer there; pass -m MODEL to replay "
                             "it on another model (its tokens will differ)\n")  # fmt: skip
