"""A GGUF model loaded by llama.cpp, standing where a transformers model stands in a
:class:`~llmsample.models.loading.LoadedModel`: it has the ``config`` and ``generation_config``
the engine reads (vocabulary size, context length, end-of-turn ids), and makes the llama.cpp
contexts the backend (:mod:`llmsample.engine.llamacpp_batch`) decodes in."""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Any

from llmsample.errors import RuntimeFailure, UserError
from llmsample.models.llamacpp_lib import silence_llama_cpp

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ
CACHE_TYPE = 1  # the KV cache's ggml type: GGML_TYPE_F16, llama.cpp's default (0, F32: the tests' exact one)


class LlamaCppModel:
    """llama.cpp's model handle with the Hugging Face config read from the same GGUF."""

    def __init__(self, path: Path, config: Any, generation_config: Any, threads: int) -> None:
        """``threads``: llama.cpp's threads per forward pass (as many as torch uses)."""
        self.lib = lib = silence_llama_cpp()
        self.path = path
        self.config = config
        self.generation_config = generation_config
        self.threads = max(1, threads)
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        # No repacked weight buffers: their AMX kernels die of SIGILL where the OS does not grant
        # AMX to the process (the development machine's sandbox), and llama.cpp cannot tell.
        params.use_extra_bufts = False
        handle = lib.llama_model_load_from_file(str(path).encode(), params)
        if not handle:
            raise UserError(f"llama.cpp cannot load {path} (not a GGUF model it knows); use --backend transformers")
        self.handle = handle
        self.vocab = lib.llama_model_get_vocab(handle)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        if self.n_vocab != config.vocab_size:
            raise UserError(
                f"{path}: llama.cpp sees {self.n_vocab} tokens and the tokenizer's config {config.vocab_size}; "
                "use --backend transformers"
            )
        self.file_type = self._file_type()

    def _file_type(self) -> str | None:
        """The GGUF's weight type (``Q4_1``, ``F32``...), reported as the run's quantization."""
        import gguf

        buffer = ctypes.create_string_buffer(64)
        if self.lib.llama_model_meta_val_str(self.handle, b"general.file_type", buffer, 64) < 0:
            return None
        try:
            return gguf.LlamaFileType(int(buffer.value)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return None

    @property
    def dtype(self) -> Any:
        import torch

        return torch.float32  # what the logits come in

    def cell_bytes(self) -> int:
        """Bytes one position of the KV cache takes (keys and values of every layer, at the
        cache's type), as the Hugging Face config tells the shapes."""
        config = self.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 2 * config.num_hidden_layers * heads * head_dim * (4 if CACHE_TYPE == 0 else 2)

    def new_context(self, sequences: int, positions: int, batch: int, unified: bool = True) -> Any:
        """A context for ``sequences`` rows, taking ``batch`` tokens per decode. ``unified``: they
        share one cache of ``positions`` cells (a row's copy shares cells, rows of any length fit,
        and every row's attention spans every cell in use); else each sequence is a stream of
        its own, ``positions / sequences`` cells, that only its own queries attend over."""
        if sequences > MAX_SEQUENCES:
            raise UserError(f"llama.cpp decodes at most {MAX_SEQUENCES} rows at once; use a smaller --batch-size")
        lib = self.lib
        params = lib.llama_context_default_params()
        params.n_ctx = positions
        params.n_batch = params.n_ubatch = batch
        params.n_seq_max = sequences
        params.kv_unified = unified
        params.type_k = params.type_v = CACHE_TYPE
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as llama-cpp-python's Llama; on a CPU
        # its flash attention rounds queries to float16
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        context = lib.llama_init_from_model(self.handle, params)
        if not context:
            raise RuntimeFailure(
                f"llama.cpp cannot make a context of {positions} positions; try a smaller --batch-size"
            )
        return context

    def plain_cache(self) -> bool:
        """Whether the model's memory is a plain KV cache (no sliding window, no recurrent
        state): one that splits into a stream per sequence, whose sequence states
        :class:`~llmsample.engine.llamacpp_kept.HostSequence` moves between stream counts."""
        lib, handle = self.lib, self.handle
        return not (lib.llama_model_is_recurrent(handle) or lib.llama_model_is_hybrid(handle)
                    or lib.llama_model_n_swa(handle) > 0)  # fmt: skip

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """llama.cpp's own tokenization of ``text`` (no BOS added; special tokens parsed): the test
        that both backends see the same ids."""
        data = text.encode()
        size = len(data) + 8
        out = (self.lib.llama_token * size)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), out, size, False, special)
        if n < 0:
            raise ValueError(f"{-n} tokens do not fit in {size}")
        return list(out[:n])

    def close(self) -> None:
        """Free the weights; idempotent (also at exit, when the library may be half gone)."""
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self.lib.llama_model_free(handle)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be half gone
            self.close()
