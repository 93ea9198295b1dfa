"""Optional libraries hidden while transformers' modelling code first imports, for a load that runs
none of them: a shorter cold start.

transformers' modules import every optional library that is installed, whether a run uses it or
not. Two of them are a plain causal LM's largest avoidable imports (~0.8 s of a ~7 s cold start on
the transformers path; docs/history/2026-12.md, 2026-12-04):

- scipy: the object-detection losses' Hungarian matching (``transformers.loss``), for training;
- torchao: its quantizer's checkpoint (de)serialisation, for ``--quantize int8`` and checkpoints
  stored quantized with torchao;

and one that imports scipy itself, so it goes with it: scikit-learn, which transformers' generation
code imports for assisted generation's confidence threshold (5.17 at import time).

:func:`lean_imports` hides them (None in ``sys.modules``: transformers' availability checks answer
no, so its modules skip them) until the load has imported the model's classes; then they are
visible again, and transformers' cached answers are forgotten. A later load that needs torchao in
the same process (:func:`restore`) re-runs the one module that skipped it (``RERUN``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

OPTIONAL = ("scipy", "sklearn", "torchao")
RERUN = {"torchao": ("transformers.quantizers.quantizer_torchao",)}
"""transformers' modules that import from a library at import time, when it is available, and that a
load here can use (scipy's are the detection losses')."""

_hidden: list[str] = []  # hidden now
_skipped: set[str] = set()  # hidden while transformers' modules imported: they lack its names


@contextmanager
def lean_imports(quantize: str | None) -> Iterator[None]:
    """Around a load: the optional libraries hidden, if transformers' modelling code is not imported
    yet (the first load of a process) and the load does not quantize; a load that quantizes gets
    torchao back first, if an earlier one hid it."""
    if quantize:
        restore()
    elif "transformers.modeling_utils" not in sys.modules:
        for name in OPTIONAL:
            if name not in sys.modules:
                sys.modules[name] = None  # type: ignore[assignment]  # importlib's "blocked" mark
                _hidden.append(name)
                _skipped.add(name)
        _forget()  # answers cached before the hiding (a caller that asked transformers first)
    try:
        yield
    finally:
        _show()


def restore() -> None:
    """The optional libraries visible again, and what skipped torchao re-run with it, before a load
    that uses it (``--quantize int8``, a checkpoint stored quantized)."""
    _show()
    for library in sorted(_skipped):
        for module in RERUN.get(library, ()):
            if module in sys.modules:
                importlib.reload(sys.modules[module])
    _skipped.clear()


def _show() -> None:
    """Hidden libraries importable again, and transformers' cached answers about them forgotten."""
    if not _hidden:
        return
    for name in _hidden:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
    _hidden.clear()
    _forget()


def _forget() -> None:
    """transformers' cached answers about the optional libraries forgotten: the next asks again."""
    checks = sys.modules.get("transformers.utils.import_utils")
    for name in OPTIONAL:
        forget = getattr(getattr(checks, f"is_{name}_available", None), "cache_clear", None)
        if forget is not None:
            forget()
