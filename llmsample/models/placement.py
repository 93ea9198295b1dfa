"""Models bigger than one device: accelerate's placement through ``from_pretrained(device_map=...)``.

A placed model has its layers on several devices (GPUs, the CPU, or "disk": weights read from
the checkpoint when their layer runs). accelerate's hooks move each layer's inputs to that
layer's device, and the model's outputs back to the device its inputs came from. So a run feeds
its tokens to the embedding's device, each layer's KV cache fills on that layer's device (the
cache allocates where its first keys arrive), and the logits come back to the input device: the
one device every draw happens on (``LoadedModel.sample_device``), wherever the layers sit."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError

if TYPE_CHECKING:
    import torch

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)?", re.IGNORECASE)
MEMORY_KEY = re.compile(r"\d+|cpu|mps|disk")


@dataclass(frozen=True)
class Placement:
    """``device_map``: a strategy name or an explicit ``{module: device}`` map; ``max_memory``:
    ``{gpu index | "cpu": size}``; ``offload_folder``: where disk-offloaded weights go when the
    checkpoint's own files cannot serve them."""

    device_map: str | dict[str, Any]
    max_memory: dict[int | str, str] | None = None
    offload_folder: str | None = None

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory:
            kwargs["max_memory"] = self.max_memory
        if self.offload_folder:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


def parse_max_memory(text: str) -> dict[int | str, str]:
    """``0=20GiB,1=20GiB,cpu=60GiB`` as accelerate takes it; a ValueError says what is wrong."""
    limits: dict[int | str, str] = {}
    for part in text.split(","):
        key, sep, size = (s.strip() for s in part.partition("="))
        if not sep or not key or not size:
            raise ValueError(f"{part.strip()!r} is not DEVICE=SIZE; write e.g. 0=20GiB,1=20GiB,cpu=60GiB")
        if not MEMORY_KEY.fullmatch(key.lower()) or key.lower() == "disk":
            raise ValueError(f"{key!r} is not a GPU index, cpu or mps; write e.g. 0=20GiB,cpu=60GiB")
        if not SIZE.fullmatch(size):
            raise ValueError(f"{size!r} is not a size; write a number with B, KB, MB, GB, KiB, MiB or GiB, e.g. 20GiB")
        name: int | str = int(key) if key.isdigit() else key.lower()
        if name in limits:
            raise ValueError(f"{key!r} is given twice")
        limits[name] = size.replace(" ", "")
    return limits


def read_device_map(value: str) -> str | dict[str, Any]:
    """A strategy name, or a JSON file mapping module names to devices (``0``, ``"cuda:1"``,
    ``"cpu"``, ``"disk"``); a ValueError says what is wrong."""
    if value in DEVICE_MAP_STRATEGIES:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"{value!r} is neither {', '.join(DEVICE_MAP_STRATEGIES)} nor a JSON file mapping module names to devices"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {value} as JSON ({exc})") from exc
    if not isinstance(data, dict) or not data or not all(isinstance(k, str) for k in data):
        raise ValueError(f"{value} must hold a JSON object mapping module names to devices")
    for module, device in data.items():
        if isinstance(device, bool) or not isinstance(device, int | str):
            raise ValueError(f"{value}: {module!r} maps to {device!r}; use a GPU index, 'cuda:N', 'cpu' or 'disk'")
    return data


def check_devices(placement: Placement) -> None:
    """GPU indices that this machine lacks fail in accelerate deep in the load, after a log line:
    say so first, in one line."""
    import torch

    count = torch.cuda.device_count()
    wanted: list[tuple[str, Any]] = [("--max-memory", key) for key in placement.max_memory or {}]
    if isinstance(placement.device_map, dict):
        wanted += [("--device-map", device) for device in placement.device_map.values()]
    for flag, device in wanted:
        index = _gpu_index(device)
        if index is not None and index >= count:
            have = f"only {count} CUDA device(s)" if count else "no CUDA device"
            raise UserError(f"{flag} names GPU {index}, but this machine has {have}; name the devices it has")
        if device == "mps" and not torch.backends.mps.is_available():
            raise UserError(f"{flag} names mps, which this machine does not have")


def _gpu_index(device: Any) -> int | None:
    if isinstance(device, int):
        return device
    text = str(device)
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    if text.isdigit():
        return int(text)
    return None


def placement_device(placement: Placement) -> torch.device:
    """The device the dtype is chosen for: the first GPU the placement may use, else the CPU."""
    import torch

    if isinstance(placement.device_map, dict):
        indices = [i for i in map(_gpu_index, placement.device_map.values()) if i is not None]
        return torch.device("cuda", min(indices)) if indices else torch.device("cpu")
    if torch.cuda.is_available() and (
        placement.max_memory is None or any(isinstance(k, int) for k in placement.max_memory)
    ):
        return torch.device("cuda", 0)
    return torch.device("cpu")


def execution_device(module: Any) -> torch.device | None:
    """Where accelerate runs ``module`` (its hook's device); None without a hook."""
    import torch

    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is None:
        return None
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def input_device(model: Any) -> torch.device:
    """Where a model's token ids go: its embedding's device (its execution device when the
    embedding's weights are offloaded and sit on ``meta`` between calls). Something that is not a
    transformers model (a test double) goes by its first parameter, else the CPU."""
    import torch

    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        embedding = None
    if embedding is not None:
        device = execution_device(embedding)
        if device is not None:
            return device
        if embedding.weight.device.type != "meta":
            return embedding.weight.device
        return execution_device(model) or torch.device("cpu")
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device(getattr(model, "device", "cpu"))


def placed_devices(model: Any) -> list[str]:
    """The devices of a placed model's modules, in first-use order (``["cpu", "disk"]``); empty
    for a model on one device without a map."""
    seen: list[str] = []
    for device in (getattr(model, "hf_device_map", None) or {}).values():
        name = f"cuda:{device}" if isinstance(device, int) else str(device)
        if name not in seen:
            seen.append(name)
    return seen
