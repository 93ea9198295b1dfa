"""Hugging Face checkpoints written to GGUF once, for llama.cpp (``--backend llama.cpp``, and
``auto`` on a CPU): the checkpoint's own precision, or ``--gguf-type`` through llama.cpp's own
quantizer; cached in the model cache with the conversion's staging-and-rename rules
(:mod:`llmsample.models.gguf_to_hf`), so a killed conversion leaves nothing loadable and a
folder that lost its file is converted again. The default model's GGUF is the wheel's Q4_1 file
rewritten by llama.cpp's quantizer at F16 (:func:`requantized`; Q4_1's 8-bit activations answer "L'Étoile" for the
capital of France; F16 answers Paris)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError, first_line
from llmsample.models.gguf_to_hf import WEIGHT_FILES, gguf_key, install, models_dir, staging_beside
from llmsample.models.gguf_vocab import add_tokenizer, matching_pre, tokenizer_kind

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch
    from rich.progress import Progress

ARCHES = {
    "LlamaForCausalLM": "LLAMA", "MistralForCausalLM": "LLAMA", "Qwen2ForCausalLM": "QWEN2",
    "Qwen3ForCausalLM": "QWEN3", "GemmaForCausalLM": "GEMMA", "Phi3ForCausalLM": "PHI3",
}  # fmt: skip
"""Architectures written here, by llama.cpp's name (Mistral is Llama to llama.cpp)."""

PERMUTED = ("LLAMA",)
"""Architectures whose q and k llama.cpp wants in its interleaved rotary layout."""

FILE = "model.gguf"
MANIFEST = "gguf.json"


def file_type(name: str) -> int:
    """llama.cpp's file-type number for ``F16``, ``Q8_0``, ``Q4_K_M``...; an unknown name is one line."""
    import gguf

    for prefix in ("MOSTLY_", "ALL_"):
        member = gguf.LlamaFileType.__members__.get(prefix + name.upper())
        if member is not None:
            return int(member)
    known = ", ".join(n.split("_", 1)[1] for n in gguf.LlamaFileType.__members__ if "_" in n)
    raise UserError(f"--gguf-type {name}: not a llama.cpp weight type; one of {known}")


def unconvertible(folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` cannot be written to GGUF here, None when it can (read
    from config.json and tokenizer.json alone: cheap enough for ``--backend auto``)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no readable config.json"
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHES or config.get("auto_map"):
        return f"architecture {arch} is not one written to GGUF here ({', '.join(ARCHES)})"
    if rope_type(config) not in ("linear", "default"):
        return f"rope scaling {rope_type(config)!r} is not written to GGUF here"
    if config.get("quantization_config"):
        return "its weights are stored quantized"
    if not any((folder / f).is_file() for f in WEIGHT_FILES):
        return "no weights file"
    if tokenizer_kind(folder) is None:
        return "its tokenizer (tokenizer.json) is not a BPE tokenizer llama.cpp runs"
    return None


def rope(config: dict[str, Any]) -> dict[str, Any]:
    """The rotary settings: ``rope_parameters`` (transformers 5), else the older ``rope_scaling``."""
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def rope_type(config: dict[str, Any]) -> str:
    settings = rope(config)
    return settings.get("rope_type", settings.get("type", "default"))


def checkpoint_key(folder: Path) -> str:
    """One version of a checkpoint folder: its path and its files' sizes and modification times."""
    parts = [str(folder.resolve())]
    for path in sorted(folder.iterdir()):
        if path.is_file():
            stat = path.stat()
            parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def is_complete_gguf(path: Path) -> bool:
    """The folder's GGUF is there and as long as the manifest written before the rename says."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        return (path / FILE).stat().st_size == manifest["bytes"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def checkpoint_gguf(folder: Path, gguf_type: str | None, progress: Progress | None = None) -> Path:
    """The GGUF of the checkpoint in ``folder`` (at ``gguf_type``, else its own precision),
    written once into the model cache."""
    why = unconvertible(folder)
    if why is not None:
        raise UserError(f"cannot run {folder} on llama.cpp: {why}; use --backend transformers")
    label = (gguf_type or "own").upper()
    target = models_dir() / f"{folder.name}-{checkpoint_key(folder)}-{label}"
    if not is_complete_gguf(target):
        made = f"{label} GGUF" if gguf_type else "GGUF at the checkpoint's own precision"
        write = lambda staging: write_checkpoint(folder, staging, gguf_type)  # noqa: E731
        build(target, progress, f"{folder.name} to GGUF", write, folder, made)
    return target / FILE


def requantized(source: Path, gguf_type: str | None, progress: Progress | None = None) -> Path:
    """``source`` rewritten once at ``gguf_type`` by llama.cpp's quantizer (the default model's
    Q4_1 file at F16), or ``source`` itself when no type is asked or it is that type already."""
    if gguf_type is None or source.stem.upper().endswith("." + gguf_type.upper()):
        return source
    wanted = gguf_type.upper()
    target = rewritten_dir(source, wanted)
    if not is_complete_gguf(target):
        write = lambda staging: quantize(source, staging / FILE, wanted)  # noqa: E731
        build(target, progress, f"{source.name} at {wanted}", write, source, f"{wanted} GGUF")
    return target / FILE


def rewritten_dir(source: Path, gguf_type: str) -> Path:
    """Where :func:`requantized` keeps ``source`` rewritten at ``gguf_type``."""
    return models_dir() / f"{source.stem}-{gguf_key(source)}-{gguf_type.upper()}"


def build(target: Path, progress: Progress | None, what: str, write: Any, source: Path, made: str) -> None:
    """``write(staging)`` into a staging sibling of ``target``, the manifest last (with what it
    was made from: :func:`~llmsample.models.provenance.record_source`), renamed into place."""
    from llmsample.models.provenance import record_source

    staging = staging_beside(target)
    if progress is not None:
        progress.console.print(f"writing {what} once into {target.parent}")
    try:
        write(staging)
        size = (staging / FILE).stat().st_size
        record_source(staging, source, made)
        (staging / MANIFEST).write_text(json.dumps({"bytes": size}) + "\n", encoding="utf-8")
        install(staging, target, is_complete_gguf)
    except OSError as exc:
        raise UserError(f"cannot write {target} ({exc.strerror or first_line(exc)}); free some space") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def quantize(source: Path, out: Path, gguf_type: str) -> None:
    """llama.cpp's own quantizer (requantizing allowed: the wheel's file is already Q4_1)."""
    import os

    from llmsample.models.llamacpp_lib import silence_llama_cpp

    lib = silence_llama_cpp()
    params = lib.llama_model_quantize_default_params()
    params.ftype = file_type(gguf_type)
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    if lib.llama_model_quantize(str(source).encode(), str(out).encode(), params) != 0:
        raise UserError(f"llama.cpp cannot write {source.name} at {gguf_type}")


def write_checkpoint(folder: Path, staging: Path, gguf_type: str | None) -> None:
    """The checkpoint at its own precision into ``staging``, then quantized when asked."""
    from transformers import AutoTokenizer

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    arch = ARCHES[config["architectures"][0]]
    vocab = int(config["vocab_size"])

    def header(path: Path, pre: str) -> Any:
        import gguf

        writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch]])
        add_hparams(writer, config, arch)
        add_tokenizer(writer, folder, tokenizer, vocab, pre)
        return writer

    def vocab_only(path: Path, pre: str) -> None:
        writer = header(path, pre)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()

    pre = matching_pre(vocab_only, staging, folder, tokenizer)
    if pre is None:
        raise UserError(
            f"cannot run {folder} on llama.cpp: its tokenizer gives other ids there; use --backend transformers"
        )
    plain = staging / (FILE if gguf_type is None else "plain.gguf")
    writer = header(plain, pre)
    own = add_tensors(writer, folder, config, arch)
    writer.add_file_type(own)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if gguf_type is not None:
        quantize(plain, staging / FILE, gguf_type)
        plain.unlink()


def add_hparams(writer: Any, config: dict[str, Any], arch: str) -> None:
    """What llama.cpp reads of the architecture. A sliding window shorter than the context is
    honoured by cutting the context to it (the window then never slides)."""
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    context = config["max_position_embeddings"]
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", True):
        context = min(context, window)
    writer.add_context_length(context)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 1.0)))
    writer.add_rope_freq_base(float(rope(config).get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(config["vocab_size"]))
    if rope_type(config) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope(config)["factor"]))


def add_tensors(writer: Any, folder: Path, config: dict[str, Any], arch: str) -> int:
    """Every weight under llama.cpp's name (q/k permuted for Llama, Gemma's norms as llama.cpp
    stores them: 1 + w); matrices at their stored precision, vectors in float32. Returns the
    file type."""
    import gguf
    import torch

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], config["num_hidden_layers"])
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    tied = config.get("tie_word_embeddings", arch == "GEMMA")
    kinds = {torch.float32: gguf.LlamaFileType.ALL_F32, torch.float16: gguf.LlamaFileType.MOSTLY_F16,
             torch.bfloat16: gguf.LlamaFileType.MOSTLY_BF16}  # fmt: skip
    own = gguf.LlamaFileType.ALL_F32
    for name, tensor in checkpoint_tensors(folder):
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        ours = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if ours is None:
            raise UserError(f"cannot run {folder} on llama.cpp: no GGUF name for its tensor {name}")
        if arch in PERMUTED and ours.endswith(("attn_q.weight", "attn_k.weight")):
            tensor = permute(tensor, heads if "attn_q" in ours else kv_heads)
        if arch == "GEMMA" and ours.endswith("norm.weight"):
            tensor = tensor.float() + 1
        if tensor.dim() == 1 or tensor.dtype not in kinds:
            writer.add_tensor(ours, tensor.float().numpy())
        elif tensor.dtype == torch.bfloat16:
            own = kinds[tensor.dtype]
            writer.add_tensor(ours, tensor.view(torch.int16).numpy(), raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            own = kinds[tensor.dtype]
            writer.add_tensor(ours, tensor.numpy())
    return int(own)


def permute(weights: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's interleaved rotary layout for q and k, from transformers' half-split one."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def checkpoint_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every stored tensor, shard by shard (safetensors, else PyTorch pickles read weights-only)."""
    import torch
    from safetensors import safe_open

    for stem, reader in (("model.safetensors", "safetensors"), ("pytorch_model.bin", "torch")):
        index = folder / f"{stem}.index.json"
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        elif (folder / stem).is_file():
            shards = [stem]
        else:
            continue
        for shard in shards:
            if reader == "safetensors":
                with safe_open(str(folder / shard), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                        yield name, f.get_tensor(name)
            else:
                yield from torch.load(folder / shard, map_location="cpu", weights_only=True).items()
        return
