"""Decoding presets: built-in TOML files, the user's own, and ``--preset-file``."""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from llmsample.errors import UserError
from llmsample.sampling.config import ConfigError, SamplingConfig

DEFAULT_PRESET = "balanced"


@dataclass(frozen=True)
class PresetFile:
    name: str
    source: str  # "built-in" or "user"
    path: Path


def builtin_dir() -> Path:
    """Inside an installed wheel the presets live in the package; in a source checkout (or an
    editable install) they are the repository's top-level ``presets/``."""
    packaged = Path(str(resources.files("llmsample"))) / "presets"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "presets"


def user_dir() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(xdg) / "llmsample" / "presets"


_warned: set[str] = set()  # user preset directories already warned about in this process


def _toml_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.suffix.lower() == ".toml")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UserError(f"cannot read the preset directory {directory} ({exc.strerror}); fix its permissions") from exc


def _user_toml_files(directory: Path) -> list[Path]:
    """The user's preset files; a directory this user cannot read (under another user's home:
    ``sudo -u nobody`` without ``-H``) leaves the built-in presets, with a one-line warning."""
    try:
        return _toml_files(directory)
    except UserError as exc:
        if str(directory) not in _warned:
            _warned.add(str(directory))
            cause = exc.__cause__
            reason = getattr(cause, "strerror", None) or cause
            _warn(
                f"Warning: cannot read the user preset directory {printable(str(directory))} ({reason}); "
                "using the built-in presets (set XDG_CONFIG_HOME to a directory you can read)"
            )
        return []


def _warn(line: str) -> None:
    """One line on stderr; a closed or full stderr only loses it (the run goes on)."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def discover() -> dict[str, PresetFile]:
    """Every preset by name; a user preset shadows the built-in of the same name."""
    found = {p.stem: PresetFile(p.stem, "built-in", p) for p in _toml_files(builtin_dir())}
    user: dict[str, PresetFile] = {}
    for path in _user_toml_files(user_dir()):
        name = path.stem
        if name in user:
            raise UserError(f"two user presets are named {name!r} ({user[name].path}, {path}); rename one")
        user[name] = PresetFile(name, "user", path)
    return found | user


def read_preset_file(path: Path) -> SamplingConfig:
    """One TOML file to a config; every problem names the file, the key and the allowed range."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UserError(f"preset file {path} does not exist; check the path") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read preset file {path} ({exc}); check its permissions and encoding") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"preset file {path} is not valid TOML: {exc}") from exc
    try:
        return SamplingConfig.from_mapping(data)
    except ConfigError as exc:
        raise UserError(f"preset file {path}: {exc}") from exc


def printable(name: str) -> str:
    """A name taken from the file system as valid text: bytes that are not UTF-8 (which Python
    keeps as lone surrogates) become ``\\xNN``, so JSON and the terminal get valid UTF-8."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def load(name: str | None = None, preset_file: Path | None = None) -> tuple[str, SamplingConfig]:
    """The preset's display name (printable) and settings; ``--preset-file`` wins over ``--preset``."""
    if preset_file is not None:
        return printable(preset_file.stem), read_preset_file(preset_file)
    name = name or DEFAULT_PRESET
    presets = discover()
    if name not in presets:
        raise UserError(
            f"unknown preset {name!r}; choose one of: {', '.join(sorted(presets))} (see `llmsample presets list`)"
        )
    return printable(name), read_preset_file(presets[name].path)


def check_names(names: list[str]) -> None:
    """Fail on an unknown name before anything heavy (a model load) starts."""
    known = discover()
    for name in names:
        if name not in known:
            raise UserError(f"unknown preset {name!r}; choose one of: {', '.join(sorted(known))}")
