"""The suite's tiers, applied here from what each test uses rather than remembered by hand:

- ``slow``: the test starts a process, a pty, a browser or a server (through any fixture or helper),
  or took over ``HEAVY_S`` seconds in the recorded run (``heavy.txt``);
- ``model``: it uses the real default model (SmolLM2-135M-Instruct);
- ``llamacpp``: it needs llama-cpp-python.

A test's tiers are read from the names its function and its fixtures use, followed through the
suite's own helpers, classes and fixtures and the package's own functions to the modules that
start processes. What that reading misses is held at run time: a test without ``slow`` that
starts a process, or without ``model`` that loads the real model, fails and names the marker
(``make test-fast`` deselects both tiers, so an unmarked one would otherwise slow it down unseen)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import platform
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TIERS = {
    "slow": "starts a process, a pty, a browser or a server (deselected by `make test-fast`)",
    "model": "uses the real default model (deselected by `make test-fast`)",
    "llamacpp": "needs llama-cpp-python (the llamacpp extra)",
}
SPAWNING = ("subprocess", "pexpect", "ptyprocess", "playwright", "multiprocessing", "concurrent.futures.process")
"""Modules whose use means another process: a name that resolves to one (or to anything defined in one)."""
RAW_NAMES = {
    "subprocess": "slow",
    "pexpect": "slow",
    "sync_playwright": "slow",
    "llama_cpp": "llamacpp",
    "default_model_path": "model",  # the real model's folder, converted from the shipped GGUF
}
"""Names that mark a test even unresolved: an import inside a function (``import llama_cpp as lib``)."""
MODEL_FIXTURES = {"default_lm"}
"""The real model's fixtures (any fixture that depends on one is found through the closure, and a
test that asks for one by name, ``request.getfixturevalue("default_lm")``, through its strings)."""
SLOW_WORDS = {"--compile", "compile"}
"""A flag or keyword that means processes: ``--compile`` / ``compile=True`` runs inductor, which
compiles its C++ kernels with the system compiler, one process a kernel."""


def _module_tier(name: str) -> str | None:
    if name == "llama_cpp" or name.startswith("llama_cpp."):
        return "llamacpp"
    if any(name == m or name.startswith(m + ".") for m in SPAWNING):
        return "slow"
    return None


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and those nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


FOLLOWED = ("tests", "llmsample")
"""Whose functions are followed: the suite's helpers, and the package's own (``bench --startup``
starts processes for a test that calls it); a library's are not."""


def _own_functions(obj: Any, followed: tuple[str, ...]) -> list[Callable[..., Any]]:
    """The functions behind ``obj`` that are followed: itself, what it wraps (hypothesis,
    functools), a class's methods."""
    if isinstance(obj, functools.partial):
        obj = obj.func
    if not str(getattr(obj, "__module__", None) or "").startswith(followed):
        return []
    if inspect.isclass(obj):
        members = [inspect.unwrap(m.__func__ if isinstance(m, (staticmethod, classmethod)) else m)
                   for m in vars(obj).values()]  # fmt: skip
        members += [m.fget for m in vars(obj).values() if isinstance(m, property) and m.fget]
        return [m for m in members if inspect.isfunction(m)]
    inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)
    obj = inspect.unwrap(inner or obj)
    return [obj] if inspect.isfunction(obj) else []


def _imported(name: str) -> types.ModuleType | None:
    """The module a name in a function's code is, if it is one: imported inside the function, it
    names itself in full (the suite's own are imported here if the run has not yet)."""
    if name not in sys.modules and name.startswith("tests."):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    return sys.modules.get(name)


def _word_tiers(codes: list[types.CodeType]) -> set[str]:
    """Tiers named by a code's constants: a model fixture asked for by name, ``--compile`` as an
    argument, ``compile=`` as a keyword (keyword names are constants: a tuple of them)."""
    words: set[str] = set()
    for code in codes:
        for const in code.co_consts:
            if isinstance(const, str):
                words.add(const)
            elif isinstance(const, tuple) and all(isinstance(c, str) for c in const):
                words.update(const)
    return ({"model"} if words & MODEL_FIXTURES else set()) | ({"slow"} if words & SLOW_WORDS else set())


def tiers_of(obj: Any, followed: tuple[str, ...] = FOLLOWED, seen: set[int] | None = None) -> set[str]:
    """The tiers that running ``obj`` (a test, fixture, helper or class of the suite) needs;
    ``followed``: the modules whose functions are read (the suite's, the package's, the test's own)."""
    seen = set() if seen is None else seen
    found: set[str] = set()
    for function in _own_functions(obj, followed):
        if id(function) in seen:
            continue
        seen.add(id(function))
        codes = list(_codes(function.__code__))
        names = {name for code in codes for name in code.co_names}
        if not function.__module__.startswith("llmsample"):  # the package's own names and words are its business
            found |= {RAW_NAMES[name] for name in names & RAW_NAMES.keys()} | _word_tiers(codes)
        # A module imported inside the function names itself in full; what it gives is looked up there.
        local = [module for name in names if (module := _imported(name))]
        found |= {tier for module in local if (tier := _module_tier(module.__name__))}
        for name in names:
            target = function.__globals__.get(name)
            for module in local if target is None else ():
                target = getattr(module, name, None) if module.__name__.startswith(followed) else None
                if target is not None:
                    break
            if isinstance(target, types.ModuleType):
                tier = _module_tier(target.__name__)
            else:
                tier = _module_tier(str(getattr(target, "__module__", "") or ""))
            if tier:
                found.add(tier)
            elif target is not None:
                found |= tiers_of(target, followed, seen)
        if function.__module__.startswith("llmsample"):
            found &= {"slow"}  # what the package imports for itself is followed for its processes alone
    return found


def _module_level(item: pytest.Item) -> set[str]:
    """A module that skips without llama-cpp-python (``pytest.importorskip("llama_cpp")`` at its top)."""
    module = getattr(item, "module", None)
    source = inspect.getsource(module) if module is not None else ""
    lines = [line for line in source.splitlines() if not line.startswith((" ", "\t"))]
    return {"llamacpp"} if any('importorskip("llama_cpp")' in line for line in lines) else set()


def item_tiers(item: pytest.Item) -> set[str]:
    """Every tier of a collected test: its function's, each fixture's in its closure, its module's."""
    module = getattr(item, "module", None)
    followed = (*FOLLOWED, module.__name__) if module is not None else FOLLOWED
    found = tiers_of(getattr(item, "obj", None), followed) | _module_level(item)
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        if name in MODEL_FIXTURES:
            found.add("model")
        for definition in (info.name2fixturedefs.get(name, ()) if info else ()):
            found |= tiers_of(definition.func, followed)
    return found


HEAVY = Path(__file__).with_name("heavy.txt")
"""Tests that took over ``HEAVY_S`` in a recorded run of the whole suite (``make test-heavy``):
slow too, so the fast tier stays fast. A statistical test with thousands of draws needs no
process to take a minute; its time is measured, not guessed."""
HEAVY_S = 1.5


def heavy_seconds() -> dict[str, float]:
    """Each recorded test's seconds, by node id."""
    lines = HEAVY.read_text(encoding="utf-8").splitlines() if HEAVY.exists() else []
    rows = [line.split("\t", 1) for line in lines if "\t" in line and not line.startswith("#")]
    return {nodeid: float(seconds) for seconds, nodeid in rows}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def plain_nodeid(nodeid: str) -> str:
    """A node id without the ``@group`` that xdist's ``--dist loadgroup`` appends (the group is
    the module's own: see :func:`pytest_collection_modifyitems`)."""
    head, _, group = nodeid.rpartition("@")
    return head if head and group == module_of(head) else nodeid


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-heavy", action="store_true", help=f"write {HEAVY.name}: the tests over {HEAVY_S} s")


def pytest_configure(config: pytest.Config) -> None:
    for name, description in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        config.pluginmanager.register(GroupIds(), "tiers-group-ids")
    if config.getoption("--record-heavy"):
        config.pluginmanager.register(HeavyRecorder(), "heavy-recorder")


class HeavyRecorder:
    """Each test's setup and call, added up (reports reach the controller from xdist's workers)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when in ("setup", "call"):
            nodeid = plain_nodeid(report.nodeid)
            self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.config.getoption("-m") or getattr(session.config.option, "keyword", ""):
            return  # a part of the suite: the rest's record stays as it was
        rows = sorted(((s, n) for n, s in self.seconds.items() if s > HEAVY_S), reverse=True)
        lines = [f"# over {HEAVY_S} s in a run of the whole suite (make test-heavy); slow for tests/tiers.py"]
        HEAVY.write_text("\n".join([*lines, *(f"{s:.1f}\t{n}" for s, n in rows)]) + "\n", encoding="utf-8")


SHARED_SCOPES = ("module", "class")
"""A module whose tests share a fixture of one of these scopes runs on one xdist worker (an
``xdist_group`` of its own under ``--dist loadgroup``): split between two, each would build it."""


def _shares_a_fixture(item: pytest.Item) -> bool:
    """A fixture of a shared scope in the test's closure, or defined in its module (one asked for
    by name, ``request.getfixturevalue``, is in no closure)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info else ()
    if any(d.scope in SHARED_SCOPES for defs in definitions for d in defs):
        return True
    module = vars(getattr(item, "module", None) or types.ModuleType("none")).values()
    return any(getattr(getattr(f, "_fixture_function_marker", None), "scope", None) in SHARED_SCOPES for f in module)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks each test's tiers, groups a module that shares a fixture, and orders the modules by
    their recorded seconds, heaviest first (each module's tests stay together and in their order,
    so its fixtures are built once): xdist hands tests out in this order, so the last ones a
    worker takes are short and the two workers end together, where a minute-long test started
    last would run alone at the end."""
    cache: dict[Any, set[str]] = {}
    recorded = heavy_seconds()
    weight: dict[str, float] = {}
    grouped: set[str] = set()
    # A worker's dist is "no"; xdist keeps "loadgroup" for it as a flag of its own.
    loadgroup = getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup"
    for item in items:
        key = (getattr(item, "obj", None), tuple(getattr(item, "fixturenames", ())), getattr(item, "module", None))
        if key not in cache:
            cache[key] = item_tiers(item)
        found = cache[key] | ({"slow"} if item.nodeid in recorded else set())
        for tier in sorted(found - {m.name for m in item.iter_markers()}):
            item.add_marker(tier)
        module = module_of(item.nodeid)
        weight[module] = weight.get(module, 0.0) + recorded.get(item.nodeid, 0.0)
        if loadgroup and _shares_a_fixture(item):
            grouped.add(module)
    for item in items:
        module = module_of(item.nodeid)
        if module in grouped and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=lambda item: -weight[module_of(item.nodeid)])  # stable: in a module, the order stays


class GroupIds:
    """xdist (3.8) tells the controller a test's group by renaming it ``<node id>@<group>``
    through ``item._nodeid``, which pytest 9's node ids no longer read: the groups would be lost
    and a module's tests split again. Renamed here where xdist's rename did not take."""

    @pytest.hookimpl(trylast=True)  # after xdist's own rename
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            structured = getattr(item, "_id", None)
            if mark is None or "@" + str(mark.args[0]) in item.nodeid or not hasattr(structured, "parse"):
                continue
            item._id = type(structured).parse(f"{item.nodeid}@{mark.args[0]}")  # type: ignore[attr-defined]


class UnmarkedTier(Exception):
    """A test did what its tier's marker says without the marker."""


RUNNING: list[pytest.Item] = []
"""The test whose setup or call is running (none between tests: session fixtures of marked tests)."""


def _check(tier: str, what: str) -> None:
    item = RUNNING[-1] if RUNNING else None
    if item is not None and item.get_closest_marker(tier) is None:
        raise UnmarkedTier(
            f"{item.nodeid} {what} without the '{tier}' marker: use a fixture or helper the tiers know "
            f"(tests/tiers.py), or mark it @pytest.mark.{tier}"
        )


def _guarded(function: Callable[..., Any], tier: str, what: str, when: Callable[..., bool]) -> Callable[..., Any]:
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if when(*args, **kwargs):
            _check(tier, what)
        return function(*args, **kwargs)

    return guarded


def install_guards() -> None:
    """Wrap, once for the session, what starts a process and what finds the real model. Installed
    once rather than patched per test, so a test's own monkeypatch of the same names layers above."""
    from llmsample.models import gguf_to_hf, llamacpp_load, loading

    if hasattr(subprocess.Popen._execute_child, "__wrapped__"):
        return  # a planted suite run inside this one (pytester) meets the same guards
    platform.processor()  # cached from here on: its `uname -p` is no process of any test's
    always = lambda *args, **kwargs: True  # noqa: E731
    subprocess.Popen._execute_child = _guarded(subprocess.Popen._execute_child, "slow", "started a process", always)
    for name in ("fork", "forkpty"):
        setattr(os, name, _guarded(getattr(os, name), "slow", "started a process", always))
    shipped = gguf_to_hf.gguf_path

    def real(*args: Any, **kwargs: Any) -> bool:  # a test that fakes the shipped GGUF is not using it
        return gguf_to_hf.gguf_path is shipped and llamacpp_load.gguf_path is shipped

    default = _guarded(gguf_to_hf.default_model_path, "model", "loaded the real default model", real)
    gguf_to_hf.default_model_path = loading.default_model_path = default
    # The load on llama.cpp reads the shipped file's tokenizer first (--backend auto only looks at which file it is).
    llamacpp_load.read_sidecar = _guarded(
        llamacpp_load.read_sidecar, "model", "loaded the real default model",
        lambda source, *args, **kwargs: source == shipped(),
    )  # fmt: skip


def pytest_sessionstart(session: pytest.Session) -> None:
    install_guards()


@contextlib.contextmanager
def _running(item: pytest.Item) -> Iterator[None]:
    RUNNING.append(item)
    try:
        yield
    finally:
        RUNNING.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    with _running(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    with _running(item):
        return (yield)
