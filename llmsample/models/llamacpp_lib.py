"""llama-cpp-python's library, loaded quietly: one home for the log callback that every user of
the library (the backend, the GGUF writer, the benchmark's peer) installs before its first call."""

from __future__ import annotations

import ctypes
from typing import Any

_SILENT: Any = None


def silence_llama_cpp() -> Any:
    """llama.cpp logs every load to stderr; our own progress and errors replace that."""
    global _SILENT
    import llama_cpp

    if _SILENT is None:
        _SILENT = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_SILENT, ctypes.c_void_p(0))
    return llama_cpp
