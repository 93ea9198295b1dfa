"""What every request of the server reads: the model, the engine, its defaults and its limits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmsample.batch.run import BatchSettings
from llmsample.jobs import Capabilities
from llmsample.models.device import dtype_name
from llmsample.models.loading import LoadedModel
from llmsample.serve.completion_bodies import fingerprint
from llmsample.serve.engine import Engine

MAX_BODY_BYTES = 4 * 2**20
READ_TIMEOUT_S = 30.0


@dataclass
class ServeState:
    """What every request reads: the model, the engine, the server's defaults and its limits."""

    lm: LoadedModel
    engine: Engine
    settings: BatchSettings = field(default_factory=BatchSettings)
    api_key: str | None = None
    max_body: int = MAX_BODY_BYTES
    read_timeout: float = READ_TIMEOUT_S  # seconds a client has to send a request's body
    presets: frozenset[str] = frozenset()
    drafter: Callable[[], Any] | None = None  # --draft: makes each request's row's drafter
    auto: Callable[[], Any] | None = None  # --draft auto's (a job asking for auto: its own pool, whatever --draft)
    capabilities: Capabilities = field(default_factory=Capabilities)  # what a job may ask beyond a row (its drafter's kind, a reference)
    strict_api: bool = False  # --strict-api: a key the server would ignore is a 400

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.lm.name, dtype_name(self.lm.dtype), str(self.lm.device))
