"""Imports run one way: commands -> analysis/batch/bench/chat/serve -> engine -> sampling/models ->
events/errors, and no module imports one that imports it back, however far round (no circle).
Read from the source with ``ast`` (every import, also those inside functions or under
TYPE_CHECKING), so a lazy import cannot slip a layer or a circle past the test."""

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
    assert {"llmsample.cli", "llmsample.commands.compare_presets", "llmsample.engine.loop"} <= set(MODULES)
    assert "click" in MODULES["llmsample.cli"]  # and it does see imports
    assert "llmsample.render.jsonout.strict_json" in MODULES["llmsample.commands.compare_presets"]  # a lazy one too


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
UPPER = (
    "llmsample.commands",
    "llmsample.cli",
    "llmsample.analysis",
    "llmsample.render",
    "llmsample.batch",
    "llmsample.bench",
    "llmsample.chat",
    "llmsample.serve",
    "llmsample.client",
    "llmsample.api",
)


@pytest.mark.parametrize("layer", LOWER)
def test_the_core_does_not_import_the_layers_above(layer: str) -> None:
    assert offenders((layer,), UPPER) == {}


def test_sampling_and_models_do_not_import_the_engine() -> None:
    """The engine drives the chain and the model; they know nothing of the loop that drives them."""
    assert offenders(("llmsample.sampling", "llmsample.models"), ("llmsample.engine",)) == {}


BACKENDS = ("llmsample.engine.lockstep",)  # the backends that run a ModelRunner


def test_only_backends_run_the_model_runner() -> None:
    """Every forward pass goes through the seam (:mod:`llmsample.engine.backend`): the runner
    behind a backend is imported by that backend alone, never beside the seam."""
    assert "llmsample.engine.runner" in MODULES["llmsample.engine.lockstep"]
    assert offenders(("llmsample",), ("llmsample.engine.runner",), exempt=BACKENDS) == {}


BACKEND_MODULES = (
    "llmsample.engine.backend", "llmsample.engine.lockstep", "llmsample.engine.runner", "llmsample.engine.static",
    "llmsample.engine.padded", "llmsample.engine.llamacpp_batch", "llmsample.engine.llamacpp_kept",
    "llmsample.engine.hf_growing_cache",
    "llmsample.models.llamacpp_model", "llmsample.models.llamacpp_lib", "llmsample.models.native_llama",
    "llmsample.models.native_checkpoint", "llmsample.models.llamacpp_load",
)  # fmt: skip


def test_the_commands_import_no_backend() -> None:
    """A command builds jobs for an engine and renders its records: which backend runs the model
    is the plan's (:mod:`llmsample.models.plan`), and every forward pass the seam's."""
    assert all(module in MODULES for module in BACKEND_MODULES)
    assert offenders(("llmsample.commands", "llmsample.api", "llmsample.chat", "llmsample.batch"), BACKEND_MODULES) == {}


def test_batch_sits_below_the_commands_and_serve() -> None:
    """``serve`` parses its bodies with ``batch``'s requests; ``batch`` imports nothing above it
    but the engine interface ``run`` is a client of (here or warm alike), and only ``run``
    touches the model: a bad input file is reported before the model loads, and the records
    are read and written without torch."""
    assert "llmsample.batch.run" in MODULES and "llmsample.batch.requests" in MODULES["llmsample.serve.parsing"]
    above = tuple(layer for layer in UPPER if layer not in ("llmsample.batch", "llmsample.client"))
    assert offenders(("llmsample.batch",), above) == {}
    interface = ("llmsample.client.engine_client", "llmsample.client.wire")
    assert {name for name in MODULES["llmsample.batch.run"] if name.startswith("llmsample.client.")} <= {
        f"{module}.{name}" for module in interface for name in ("EngineClient", "Failed")} | set(interface)
    assert offenders(("llmsample.batch",), ("llmsample.client",), exempt=("llmsample.batch.run",)) == {}
    core = ("llmsample.engine", "llmsample.models")
    assert offenders(("llmsample.batch",), core, exempt=("llmsample.batch.run",)) == {}


def test_the_client_stands_apart_from_the_model_stack() -> None:
    """A command on a warm engine loads no model code: the client imports neither the core nor
    the server, and the server's warm endpoints read the client's wire format, not the reverse."""
    heavy = ("llmsample.engine", "llmsample.models", "llmsample.serve", "llmsample.commands", "llmsample.batch.run")
    assert offenders(("llmsample.client",), heavy) == {}
    assert "llmsample.client.wire" in MODULES["llmsample.serve.job_endpoint"]


def circles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, however far round (sorted; none is a good answer).
    Only imports of the package's own modules count, a module importing itself does not."""
    graph = {module: {n for n in names if n in modules and n != module} for module, names in modules.items()}
    reached: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])
        reached[start] = seen
    found = {tuple(sorted(n for n in reached[m] if m in reached[n])) for m in graph if m in reached[m]}
    return sorted(list(circle) for circle in found)


def test_no_import_circles() -> None:
    assert circles(MODULES) == []


def test_a_circle_is_reported() -> None:
    # a -> b -> c -> a, c -> d -> a (d imports itself too: no circle of its own), e <-> f; g: none
    planted = {"a": "b", "b": "c", "c": "ad", "d": "da", "e": "f", "f": "e", "g": ""}
    modules = {f"x.{m}": {"torch", *(f"x.{t}" for t in targets)} for m, targets in planted.items()}
    assert circles(modules) == [["x.a", "x.b", "x.c", "x.d"], ["x.e", "x.f"]]


# --- names: a module's basename says which room it is in -------------------------------------------

SHARED_BASENAMES = {"__init__", "__main__"}


def command_modules() -> set[str]:
    """The modules that hold a CLI command, named for it (``commands/batch.py`` runs ``llmsample
    batch``): the one name a layer may share, with the concept the command drives."""
    from llmsample.cli import COMMANDS

    return {target.split(":")[0] for target in COMMANDS.values()}


def repeated_basenames(modules: list[str], commands: set[str]) -> dict[str, list[str]]:
    """Basenames that more than one module has, less the shared ones and a command's own module."""
    by_name: dict[str, list[str]] = {}
    for module in modules:
        by_name.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    found = {}
    for name, places in by_name.items():
        others = [m for m in places if not (m.rsplit(".", 1)[0].endswith(".commands") and name in commands)]
        if name not in SHARED_BASENAMES and len(others) > 1:
            found[name] = sorted(places)
    return found


def test_no_two_modules_share_a_basename() -> None:
    """In a traceback or an editor tab, ``rows.py`` must not be the engine's or the server's: every
    module's basename is its own, but for a command's module (docs/architecture.md, "Names")."""
    files = [module_name(path) if path.name != "__init__.py" else f"{module_name(path)}.__init__"
             for path in sorted(PACKAGE.rglob("*.py"))]  # fmt: skip
    assert repeated_basenames(files, command_modules()) == {}


def test_a_repeated_basename_is_reported() -> None:
    modules = ["x.engine.rows", "x.serve.rows", "x.commands.batch", "x.batch.batch", "x.a.__init__", "x.b.__init__"]
    assert repeated_basenames(modules, {"batch"}) == {"rows": ["x.engine.rows", "x.serve.rows"]}
    assert repeated_basenames(["x.engine.batch", "x.bench.batch", "x.commands.batch"], {"batch"}) == {
        "batch": ["x.bench.batch", "x.commands.batch", "x.engine.batch"]
    }


# --- the benchmarks: one package, behind `llmsample bench` ---------------------------------------

BENCH = ("single", "batch_sizes", "workloads", "quant", "results")


def test_the_benchmarks_are_one_package() -> None:
    assert {f"llmsample.bench.{name}" for name in BENCH} <= set(MODULES)
    assert [m for m in MODULES if m.startswith("llmsample.bench_")] == []  # no stragglers beside it
    assert "llmsample.engine.continuous_batch" in MODULES["llmsample.bench.batch_sizes"]  # the bench drives the engine
    # The command reads and writes results without the model stack.
    assert offenders(("llmsample.bench.results",), LOWER) == {}


def test_no_python_m_side_entry() -> None:
    """Every benchmark runs as `llmsample bench ...`: `python -m llmsample` is the only entry."""
    entries = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and ast.unparse(node) == "__name__ == '__main__'":
                entries.append(module_name(path))
    assert entries == [] or entries == ["llmsample.__main__"]


def patches(path: Path) -> list[str]:
    """What could replace a method in ``path``: something that may be a function (a name, an
    attribute, a lambda) assigned to another object's attribute (``obj.name = timed``; an
    object's own state, ``self.name = ...``, and counts, ``n.tokens += 1``, are not), and
    ``setattr`` calls."""
    found = []
    callable_like = ast.Name | ast.Attribute | ast.Lambda
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign) and isinstance(node.value, callable_like):
            found += [
                f"{path.name}:{node.lineno}" for t in node.targets
                if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self")
            ]  # fmt: skip
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_benchmark_patches_the_engine() -> None:
    """Timings come through hooks (``on_forward``), never by replacing a method of what is measured."""
    assert [p for path in sorted((PACKAGE / "bench").rglob("*.py")) for p in patches(path)] == []


def test_a_patch_is_seen(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text(
        "runner._forward = timed\nsetattr(runner, 'step', timed)\nx = 1\nself.at = now\n"
        "counts.tokens += 1\ntable.caption = 'a' + b\nbackend.step = lambda t: t\n"
    )
    assert sorted(patches(tmp_path / "x.py")) == ["x.py:1", "x.py:2", "x.py:7"]
