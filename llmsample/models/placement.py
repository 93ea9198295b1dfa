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
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip
MEMORY_KEY = re.compile(r"\d+|cpu|mps|disk")
MAP_DEVICE = re.compile(r"cpu|mps|disk|cuda(:\d+)?")


@dataclass(frozen=True)
class Placement:
    """``device_map``: a strategy name or an explicit ``{module: device}`` map; ``max_memory``:
    ``{gpu index | "cpu": size}``; ``offload_folder``: where disk-offloaded weights go when the
    checkpoint's own files cannot serve them."""

    device_map: str | dict[str, Any]
    max_memory: dict[int | str, int] | None = None
    offload_folder: str | None = None

    def kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory:
            kwargs["max_memory"] = self.max_memory
        if self.offload_folder:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


def parse_max_memory(text: str) -> dict[int | str, int]:
    """``0=20GiB,1=20GiB,cpu=60GiB`` (or plain bytes) as bytes per device, the form accelerate
    takes for every size (its own parser refuses plain digits in a string, and reads ``kb`` as
    kilobits); a ValueError says what is wrong."""
    limits: dict[int | str, int] = {}
    for part in text.split(","):
        key, sep, size = (s.strip() for s in part.partition("="))
        if not sep or not key or not size:
            raise ValueError(f"{part.strip()!r} is not DEVICE=SIZE; write e.g. 0=20GiB,1=20GiB,cpu=60GiB")
        if not MEMORY_KEY.fullmatch(key.lower()) or key.lower() == "disk":
            raise ValueError(f"{key!r} is not a GPU index, cpu or mps; write e.g. 0=20GiB,cpu=60GiB")
        found = SIZE.fullmatch(size)
        if not found:
            raise ValueError(f"{size!r} is not a size; write a number with B, KB, MB, GB, KiB, MiB or GiB, e.g. 20GiB")
        name: int | str = int(key) if key.isdigit() else key.lower()
        if name in limits:
            raise ValueError(f"{key!r} is given twice")
        number, unit = found.groups()
        limits[name] = int(float(number) * UNITS[(unit or "").upper()])
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
    devices: dict[str, Any] = {}
    for module, device in data.items():
        named = _device_name(device)
        if named is None:
            raise ValueError(
                f"{value}: {module!r} maps to {device!r}, which is no device; "
                "use a GPU index, 'cuda:N', 'cpu', 'mps' or 'disk'"
            )
        devices[module] = named
    return devices


def _device_name(device: Any) -> int | str | None:
    """A map's device as accelerate takes it (a GPU index as an int, digits too), None when it
    names no device (``"gpu7"``, ``-1``, ``true``)."""
    if isinstance(device, bool) or not isinstance(device, int | str):
        return None
    if isinstance(device, str) and device.isdigit():
        device = int(device)
    if isinstance(device, int):
        return device if device >= 0 else None
    return device if MAP_DEVICE.fullmatch(device) else None


def check_devices(placement: Placement) -> None:
    """GPU indices that this machine lacks fail in accelerate deep in the load, after a log line:
    say so first, in one line."""
    import torch

    count = torch.cuda.device_count()
    wanted: list[tuple[str, Any]] = [("--max-memory names", key) for key in placement.max_memory or {}]
    if isinstance(placement.device_map, dict):
        wanted += [(f"--device-map maps {module!r} to", device) for module, device in placement.device_map.items()]
    for flag, device in wanted:
        index = _gpu_index(device)
        if index is not None and index >= count:
            have = f"only {count} CUDA device(s)" if count else "no CUDA device"
            raise UserError(f"{flag} GPU {index}, but this machine has {have}; name the devices it has")
        if device == "mps" and not torch.backends.mps.is_available():
            raise UserError(f"{flag} mps, which this machine does not have")


def check_map_covers(model: Any, device_map: dict[str, Any], name: str) -> None:
    """accelerate's rule for an explicit map, checked before the load (transformers would put
    what the map leaves out on the CPU, and ignore an entry that names nothing): every entry names
    a module or tensor of the model (``""``: all of it), and every parameter and buffer is under
    an entry. ``model``: the model's skeleton (meta tensors)."""
    modules = dict(model.named_modules())
    tensors = [t for t, _ in model.named_parameters(remove_duplicate=False)]
    tensors += [t for t, _ in model.named_buffers(remove_duplicate=False)]
    known = set(modules) | set(tensors)
    for key in device_map:
        if key != "" and key not in known:
            raise UserError(
                f"--device-map names {key!r}, which model {name!r} does not have ({_nearby(key, modules)}); "
                "name its modules"
            )
    if "" in device_map:
        return
    keys = list(device_map)
    uncovered = [t for t in tensors if not any(t == k or t.startswith(k + ".") for k in keys)]
    missing = list(dict.fromkeys(t.rpartition(".")[0] or t for t in uncovered))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise UserError(
            f"--device-map gives no device to {', '.join(map(repr, missing[:3]))}{more} of model {name!r}; "
            "map every module with weights (or a module that holds it)"
        )


def _nearby(key: str, modules: dict[str, Any]) -> str:
    """What the model has where ``key`` points: the children of its longest existing prefix."""
    parts = key.split(".")
    parent = next((".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in modules), "")
    children = [child for child, _ in modules[parent].named_children()]
    full = [f"{parent}.{child}" if parent else child for child in children]
    if not full:
        return f"{parent} has no submodules"
    if len(full) > 2 and all(child.isdigit() for child in children):
        listed = f"{full[0]} to {full[-1]}"
    else:
        listed = ", ".join(full[:6]) + (", ..." if len(full) > 6 else "")
    return f"{parent or 'it'} holds {listed}"


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
