"""llmsample's own forward (``--backend torch``, models/native_llama.py) against transformers' on the same
weights (the real peer): tiny random Llama (untied; tied with Llama 3.1's rope scaling; with
attention and MLP biases), Qwen2 (q/k/v biases) and Mistral (a 4-position sliding window) through every operation of the padded
batch: ragged prefill, steps, ragged verification and rollback holes, a join mid-decode, rows
kept and replicated, a saved row admitted again, the logit lens. float32 logits agree to 1e-5
(bit for bit where the kernels are the same), bf16 closely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from llmsample.engine.padded import PaddedBatch
from llmsample.models.loading import load_model
from tests.conftest import make_tiny_model


def save_tiny(path: Path, kind: str, shard: str | None = None, **settings: Any) -> Path:
    """The tiny word-level tokenizer (conftest's) with a random model of ``kind`` over it (in
    safetensors shards of at most ``shard``, with their index)."""
    import transformers

    make_tiny_model(path)
    names = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
    config = getattr(transformers, f"{names[kind]}Config")(**{
        "vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "initializer_range": 0.5, "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, **settings,
    })  # fmt: skip
    torch.manual_seed(3)
    model = getattr(transformers, f"{names[kind]}ForCausalLM")(config)
    for name, parameter in model.named_parameters():  # random biases: a forward that dropped them would differ
        if name.endswith("bias"):
            parameter.data.normal_(0, 0.5)
    if shard is not None:
        (path / "model.safetensors").unlink()  # the tokenizer's model, replaced by the shards
    model.save_pretrained(path, **({} if shard is None else {"max_shard_size": shard}))
    return path


LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
MODELS = {
    "llama": lambda path: make_tiny_model(path),
    "llama-tied-llama3": lambda path: save_tiny(path, "llama", tie_word_embeddings=True, rope_parameters=LLAMA3),
    "llama-sharded": lambda path: save_tiny(path, "llama", shard="20KB"),  # an index and its shards
    "llama-biases": lambda path: save_tiny(path, "llama", attention_bias=True, mlp_bias=True),
    "qwen2": lambda path: save_tiny(path, "qwen2"),
    "mistral-window": lambda path: save_tiny(path, "mistral", sliding_window=4),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return MODELS[request.param](tmp_path_factory.mktemp(request.param) / "model")


def pair(folder: Path, dtype: str) -> tuple[Any, Any]:
    """The folder loaded by both backends. Only the forward passes are compared here, so Qwen2's
    tokenizer (refused on torch: tests/commands/test_native_backend.py) is let through."""
    from llmsample.models import native_checkpoint as native_load

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_load, "OWN_TOKENIZER_CLASS", {})
        return (load_model(str(folder), "cpu", dtype, backend="transformers"),
                load_model(str(folder), "cpu", dtype, backend="torch"))  # fmt: skip


def operations(lm: Any) -> list[torch.Tensor]:
    """Every padded-batch operation in turn; the logits each gives."""
    batch = PaddedBatch(lm.model)
    out = [batch.admit([[0, 5, 6, 7, 8, 9], [0, 9]])]  # ragged prompts, left-padded
    out.append(batch.step(torch.tensor([3, 4])))
    out.append(batch.verify([[10, 11, 12], [13]]))  # ragged drafts
    batch.rollback(0, 8)  # row 0 keeps one draft: holes after it
    out.append(batch.step(torch.tensor([14, 15])))
    out.append(batch.admit([[0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]))  # a join mid-decode, longer than the others
    out.append(batch.step(torch.tensor([16, 17, 18])))
    saved = batch.save(0, 7)
    batch.keep([2, 0])  # a row leaves, the others reorder
    out.append(batch.step(torch.tensor([19, 20])))
    out.append(batch.admit_copies([0, 21, 22, 23], 2))  # one prefill, two rows
    out.append(batch.admit_saved(saved, 7, [24, 25]))  # the prompt cache's saved row
    out.append(batch.step(torch.tensor([26, 27, 28, 29, 30])))
    out.append(batch.verify([[3, 4], [5], [6, 7, 8], [9], [10, 11]]))
    return out


def test_every_padded_batch_operation_gives_transformers_logits(folder: Path) -> None:
    if folder.parent.name.startswith("llama-sharded"):
        assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    hf, native = pair(folder, "float32")
    assert native.backend == "torch" and type(native.model).__name__ == "NativeCausalLM"
    for theirs, ours in zip(operations(hf), operations(native), strict=True):
        assert theirs.shape == ours.shape
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_bf16_logits_are_close(folder: Path) -> None:
    hf, native = pair(folder, "bfloat16")
    for theirs, ours in zip(operations(hf), operations(native), strict=True):
        assert (ours - theirs).abs().max() <= 2e-2 * theirs.abs().max()


def test_hidden_states_and_the_logit_lens_are_transformers(folder: Path) -> None:
    hf, native = pair(folder, "float32")
    ids = torch.tensor([[0, 5, 6, 7, 8, 9, 10]])
    with torch.inference_mode():
        theirs = hf.model(input_ids=ids, output_hidden_states=True).hidden_states
        ours = native.model(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    lenses = [PaddedBatch(lm.model).admit_layers([0, 5, 6, 7, 8]) for lm in (hf, native)]
    torch.testing.assert_close(lenses[1], lenses[0], rtol=0, atol=1e-5)


def test_a_tied_head_is_the_embedding_and_an_untied_one_its_own(tmp_path: Path) -> None:
    from llmsample.models.native_checkpoint import read_native

    tied = read_native(MODELS["llama-tied-llama3"](tmp_path / "tied"), "tied", torch.float32)[0]
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    untied = read_native(MODELS["llama"](tmp_path / "untied"), "untied", torch.float32)[0]
    assert not torch.equal(untied.lm_head.weight, untied.model.embed_tokens.weight)
