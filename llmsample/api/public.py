"""``llmsample.Engine``: the CLI's engine interface for notebooks and scripts. An engine in this
process (``Engine(model=...)``) or a warm one (``Engine.connect()``) takes a prompt and the
settings ``generate`` takes, and gives back what ``generate`` prints: the text, every token's
record as ``--format jsonl`` writes it, and the run's summary; in Jupyter a result shows as the
``--html`` page. The same seed gives the same tokens as the CLI, since both send the same job to
the same engine (:class:`~llmsample.client.engine_client.EngineClient`)."""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmsample.client.engine_client import EngineClient
from llmsample.client.wire import Failed
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import Summary, TokenEvent
from llmsample.jobs import AUTO, NGRAM, Explanation, Job


@dataclass(frozen=True)
class Result:
    """One answer: ``events`` as the loop yielded them, and its ``summary`` (seed, speed, why it
    stopped). ``asked``: the prompt and the settings it ran with, shown atop its page."""

    events: list[TokenEvent]
    summary: Summary
    asked: tuple[str, dict[str, Any]] = field(default=("", {}), repr=False)

    @property
    def text(self) -> str:
        return "".join(event.text for event in self.events)

    @property
    def tokens(self) -> list[dict[str, Any]]:
        """Every token's record as ``generate --format jsonl`` writes it, read back."""
        from llmsample.render.jsonout import strict_json

        return [json.loads(strict_json(event.to_dict())) for event in self.events]

    def html(self) -> str:
        """The page ``generate --html`` writes for this answer."""
        from llmsample.render.html import PageHead, render_page

        return render_page(self.events, self.summary, head=PageHead(*self.asked))

    def _repr_html_(self) -> str:
        """Jupyter's view: the ``--html`` page in a frame of its own (its styles stay in it; the
        model's text is escaped in the page, and the page once more as the frame's source)."""
        lines = self.text.count("\n") + len(self.text) // 90
        height = min(720, 260 + 26 * lines)
        return f'<iframe srcdoc="{html.escape(self.html())}" style="width:100%;height:{height}px;border:0"></iframe>'


class Stream:
    """``Engine.stream``'s tokens as they are sampled; ``result`` once the last has come.
    Leaving the loop early (``break``, closing it) cancels the row."""

    def __init__(self, records: Iterator[TokenEvent | Summary], asked: tuple[str, dict[str, Any]]) -> None:
        self._records, self._asked = records, asked
        self._events: list[TokenEvent] = []
        self.result: Result | None = None

    def __iter__(self) -> Iterator[TokenEvent]:
        try:
            for record in self._records:
                if isinstance(record, Summary):
                    self.result = Result(self._events, record, self._asked)
                else:
                    self._events.append(record)
                    yield record
        finally:
            self._records.close()


class Engine:
    """A model to sample from. ``Engine(model=None)`` loads the model in this process when first
    asked (None: the default model; ``backend``, ``device``, ``dtype`` as the CLI's flags, the
    backend ``LLMSAMPLE_BACKEND`` or ``auto`` when not given);
    :meth:`connect` uses a warm engine (``llmsample start``) or a server instead."""

    def __init__(
        self, model: str | None = None, *, backend: str | None = None, device: str = "auto", dtype: str = "auto"
    ) -> None:
        from llmsample.api.local import LocalEngine

        backend = _backend(backend)

        def load() -> Any:
            from llmsample.models.loading import load_model

            return load_model(model, device, dtype, backend=backend)

        def drafter(lm: Any) -> Any:  # draft="auto": the suffix pool, across this engine's jobs
            from llmsample.engine.suffix_pool import auto_drafter

            return auto_drafter(lm)

        self.client: EngineClient = LocalEngine(load, auto=drafter)
        self.model = model

    @classmethod
    def connect(
        cls,
        host: str | None = None,
        *,
        model: str | None = None,
        backend: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        api_key: str | None = None,
    ) -> Engine:
        """A server (``host``: its URL, or an engine's ``unix:PATH`` as ``llmsample ps`` shows
        it) or, without one, this user's warm engine started with these model options (as the
        CLI finds it); none running is a ``RuntimeError``."""
        from llmsample.client import registry
        from llmsample.client.connection import Target, address
        from llmsample.client.engine_client import RemoteEngine

        if host is not None:
            if not host.startswith("unix:"):
                address(host)  # a ValueError naming what is wrong with it
            target = Target(host.rstrip("/"), api_key, model)
        else:
            options = {"model": model, "backend": _backend(backend), "device": device, "dtype": dtype}
            record = registry.find(registry.spec_of(options)) if registry.runtime_path().is_dir() else None
            if record is None:
                raise RuntimeError(f"no warm engine serves {model or 'the default model'} with these options; "
                                   "start one (llmsample start) or use Engine(...) in this process")  # fmt: skip
            target = Target(record.where, name=record.name, keep_alive_s=record.keep_alive_s)
        engine = cls.__new__(cls)
        engine.client, engine.model = RemoteEngine(target), model
        return engine

    def status(self) -> dict[str, Any]:
        """The model, backend, weight type, context length and what the engine can do."""
        return self.client.status()

    def generate(self, prompt: str, **settings: Any) -> Result:
        """Sample an answer to ``prompt``. ``settings``: ``preset`` (a name), ``seed``, ``system``,
        ``raw`` (no chat template), ``top_n`` (alternatives per token), ``draft`` (``"auto"``, the
        default: drafts the engine expects kept, as the CLI's; ``"ngram"``; ``"none"``),
        ``watch`` (tokens followed at every step), ``ignore_eos``, and any sampling setting by
        its preset key (``temperature=0.7``, ``top_k=40``, ``max_tokens=64``...)."""
        stream = self.stream(prompt, **settings)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def stream(self, prompt: str, **settings: Any) -> Stream:
        """:meth:`generate`'s tokens one by one, as they are sampled."""
        job = self.job(prompt, **settings)
        return Stream(self.client.run(job), (prompt, job.cfg.as_dict()))

    def batch(self, prompts: Sequence[str], **settings: Any) -> list[Result]:
        """Several prompts decoded together, each drawing the tokens :meth:`generate` draws for
        it alone (a ``seed`` given is every prompt's; without one each draws its own); their
        figures agree to rounding, since the rows share the model's passes."""
        jobs = [self.job(prompt, **settings) for prompt in prompts]
        events: list[list[TokenEvent]] = [[] for _ in jobs]
        results: list[Result | None] = [None] * len(jobs)
        for index, record in self.client.run_many(jobs):
            if isinstance(record, Failed):
                raise (UserError if record.user_error else RuntimeFailure)(f"prompt {index}: {record.message}")
            if isinstance(record, Summary):
                results[index] = Result(events[index], record, (prompts[index], jobs[index].cfg.as_dict()))
            else:
                events[index].append(record)
        return [result for result in results if result is not None]

    def explain(self, prompt: str, continuation: str | None = None, **settings: Any) -> Any:
        """Why the next token: the chain's candidates stage by stage (a ``ChainReport``), or
        ``continuation`` scored token by token under the preset (a list of ``ScoredToken``)."""
        watch = tuple(settings.pop("watch", ()))
        settings["draft"] = "none"  # nothing is decoded
        job = self.job(prompt, top_n=settings.pop("top_n", 10), **settings)
        return self.client.explain(Explanation(job, continuation, watch))

    def job(
        self,
        prompt: str,
        *,
        preset: str | None = None,
        seed: int | None = None,
        system: str | None = None,
        raw: bool = False,
        top_n: int = 5,
        draft: str = "auto",
        watch: Sequence[str] = (),
        ignore_eos: bool = False,
        **sampling: Any,
    ) -> Job:
        """The job these settings ask for, resolved as the CLI resolves its flags: the preset,
        then the settings given on top (a bad one is a ``ValueError`` naming it); a fresh seed
        when none is given, kept in the result's summary."""
        from llmsample.sampling import presets
        from llmsample.sampling.config import ConfigError, SamplingConfig, fresh_seed

        if draft not in ("auto", "ngram", "none"):
            raise ValueError(f"draft={draft!r}: the Python API drafts with 'auto', 'ngram' (prompt lookup) or 'none'")
        unknown = sorted(set(sampling) - {f.name for f in dataclasses.fields(SamplingConfig)} - {"constraint"})
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a setting; the settings are a preset's keys (llmsample presets)")
        try:
            name, cfg = presets.load(preset)
            cfg = cfg.with_overrides(seed=seed, **sampling)
        except (ConfigError, UserError) as exc:
            raise ValueError(str(exc)) from None
        if cfg.seed is None:
            cfg = dataclasses.replace(cfg, seed=fresh_seed())
        return Job(prompt, cfg, name, system, raw, "error", top_n, model=self.model,
                   ngram=NGRAM if draft == "ngram" else None, cache_prompt=False, ignore_eos=ignore_eos,
                   watch=tuple(watch), drafter=AUTO if draft == "auto" else None)  # fmt: skip

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _backend(given: str | None) -> str:
    """The CLI's ``--backend`` default: ``LLMSAMPLE_BACKEND``, else ``auto``."""
    import os

    return given or os.environ.get("LLMSAMPLE_BACKEND") or "auto"
