"""Imports run one way: commands -> analysis/bench -> engine -> sampling/models -> events/errors.
Read from the source with ``ast`` (every import, also those inside functions or under
TYPE_CHECKING), so a lazy import cannot slip a layer past the test."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llmsample"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports; ``from a import b`` counts as ``a`` and ``a.b`` (b may be a module)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                module = ".".join([*package[: len(package) - node.level + 1], *([module] if module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


MODULES = {module_name(path): imported(path) for path in sorted(PACKAGE.rglob("*.py"))}


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def offenders(
    importers: tuple[str, ...], forbidden: tuple[str, ...], exempt: tuple[str, ...] = ()
) -> dict[str, list[str]]:
    """Modules under ``importers`` (and not under ``exempt``) that import something under ``forbidden``."""
    found: dict[str, list[str]] = {}
    for module, names in MODULES.items():
        if within(module, importers) and not within(module, exempt):
            bad = sorted(n for n in names if within(n, forbidden))
            if bad:
                found[module] = bad
    return found


def test_the_walk_sees_the_package() -> None:
    assert {"llmsample.cli", "llmsample.commands.compare", "llmsample.engine.loop"} <= set(MODULES)
    assert "click" in MODULES["llmsample.cli"]  # and it does see imports
    assert "llmsample.render.jsonout.strict_json" in MODULES["llmsample.commands.compare"]  # a lazy one too


def test_relative_imports_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = tmp_path / "llmsample" / "engine"
    engine.mkdir(parents=True)
    (engine / "x.py").write_text("from . import loop\nfrom ..render import stream\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "llmsample")
    assert {"llmsample.engine.loop", "llmsample.render", "llmsample.render.stream"} <= imported(engine / "x.py")


def test_a_violation_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MODULES, "llmsample.engine.fake", {"llmsample.render", "llmsample.render.stream", "torch"})
    assert offenders(("llmsample.engine",), UPPER) == {
        "llmsample.engine.fake": ["llmsample.render", "llmsample.render.stream"]
    }


def test_only_the_commands_import_click() -> None:
    assert offenders(("llmsample",), ("click",), exempt=("llmsample.commands", "llmsample.cli")) == {}


LOWER = ("llmsample.sampling", "llmsample.engine", "llmsample.models")
UPPER = ("llmsample.commands", "llmsample.cli", "llmsample.analysis", "llmsample.render", "llmsample.bench",
         "llmsample.bench_results", "llmsample.bench_quant")  # fmt: skip


@pytest.mark.parametrize("layer", LOWER)
def test_the_core_does_not_import_the_layers_above(layer: str) -> None:
    assert offenders((layer,), UPPER) == {}


def test_analysis_and_bench_do_not_import_the_commands() -> None:
    users = ("llmsample.analysis", "llmsample.bench", "llmsample.bench_results", "llmsample.bench_quant")
    assert offenders(users, ("llmsample.commands", "llmsample.cli")) == {}
