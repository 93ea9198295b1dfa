"""The directory of a user's engines when it cannot hold one: too deep for a Unix socket's path
(``XDG_RUNTIME_DIR``, else the temporary directory). ``start`` says so in one line naming the
variable, exit 2, before any engine (or model) is started; in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.client import registry
from llmsample.commands import engines


def no_spawn(*args: object) -> None:
    raise AssertionError("an engine was started")


@pytest.mark.parametrize("variable", ["XDG_RUNTIME_DIR", "TMPDIR"])
def test_a_runtime_directory_too_deep_for_a_socket_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:  # fmt: skip
    deep = tmp_path / ("d" * (registry.SOCKET_PATH_MAX - len(str(tmp_path))))
    deep.mkdir()
    if variable == "TMPDIR":
        monkeypatch.delenv("XDG_RUNTIME_DIR")
        monkeypatch.setattr(registry.tempfile, "gettempdir", lambda: str(deep))
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    monkeypatch.setattr(engines, "_spawn", no_spawn)
    done = CliRunner().invoke(main, ["start", "-m", "some/model"])
    assert done.exit_code == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.output
    assert f"an engine's socket in {registry.runtime_path()} would be" in done.stderr
    assert f"over the {registry.SOCKET_PATH_MAX} a Unix socket takes; set {variable}" in done.stderr
    assert not list(registry.runtime_path().glob("*.log"))
