"""The one decoding loop every command runs: a changing set of rows advancing through one
backend (:mod:`llmsample.engine.backend`). Rows join while there is room (their prompts
prefilled and merged in) and leave the forward pass as soon as they finish or fail. A step feeds
each row its newest token and, for a speculative row, its drafts; :func:`sample_step` turns the
logits into records; the loop then rolls back what was rejected and feeds the next pass.

``generate`` is one row, ``compare-presets`` every sample of a preset as rows of one prompt
(prefilled once), ``batch`` a queue feeding rows, ``speculate`` and ``batch --draft`` rows with
drafters: every record, stop rule and failure rule lives in one place."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch

from llmsample.engine.backend import Backend, open_backend
from llmsample.engine.feed import Feed, IterableFeed
from llmsample.engine.prompt_cache import PromptCache, with_prompt_cache
from llmsample.engine.row_state import BatchItem, Row, RowFailed, start_row
from llmsample.engine.speculative import DraftLength
from llmsample.engine.step import Record, StepInput, sample_step
from llmsample.errors import NoRoom, RuntimeFailure
from llmsample.events import CacheReuse
from llmsample.models.device import dtype_name
from llmsample.models.loading import LoadedModel
from llmsample.sampling.figures import WatchIndex


@dataclass(frozen=True)
class DecodeOptions:
    """What every row of a run shares: the alternatives per record, EOS handling, ``--watch``
    (``(name, token id)`` pairs), a reference model scoring every token (``--reference``), and
    the run's mode: the model loads the same whatever the mode, an engine runs its rows in one."""

    top_n: int = 5
    ignore_eos: bool = False
    watch: Sequence[tuple[str, int]] = ()
    reference: LoadedModel | None = None
    _: KW_ONLY  # the rest by name: a field added among them cannot take another's place
    on_forward: Callable[[float], None] | None = None  # the seconds of each forward pass (benchmarks)
    prompt_cache: PromptCache | None = None  # rows start from prefixes earlier and running rows hold
    deterministic: bool = False  # --deterministic: every row alone, one position per pass, no prompt cache


JOINING = 2048
"""Positions a row that joins a running server may take, for the size of a cache made once
(llama.cpp's holds twice this a row, within the context: what ``default_batch_size`` assumed
of each row's memory). Sized for the first requests alone, a longer prompt arriving later found
no room, and the step it joined failed every row in it; a pass that still finds none now holds
the joining rows back, or ends the row holding the most positions (:func:`_forward_with_room`)."""


def decode(
    lm: LoadedModel,
    items: Iterable[BatchItem] | Feed,
    max_rows: int,
    options: DecodeOptions = DecodeOptions(),
    *,
    one_prompt: bool = False,
) -> Iterator[Record]:
    """Yields ``(key, event)`` per token, then ``(key, summary)`` or ``(key, RowFailed)`` when a
    request ends, in the order rows finish (a cancelled request's summary says ``cancelled``).
    ``items``: the requests, or a :class:`Feed` they arrive through while others decode.
    ``one_prompt``: every item has the same prompt (all admitted at once, the prompt prefilled
    once; the lockstep backend is allowed)."""
    feed = IterableFeed(items) if not hasattr(items, "take") else items
    first = feed.take(max_rows, wait=True)  # type: ignore[union-attr]
    if not first:
        return
    # A static cache is sized once for the run: for every request when they are all known (a
    # later wave of a backend that cannot join reuses it), else for the first ones, and while
    # requests arrive (a server) for rows of up to JOINING positions too, and one row of the
    # whole context: one cache serves them all (llama.cpp's).
    known = items if isinstance(items, Sequence) else first
    positions = max(len(i.prompt_ids) + i.cfg.max_tokens for i in known) + DraftLength.max_k + 1
    longest = 0 if isinstance(items, Sequence) else lm.context_length or 0
    if longest:
        positions = max(positions, min(longest, JOINING))
    with contextlib.ExitStack() as stack:
        cache = options.prompt_cache if options.reference is None else None
        backend = open_backend(lm, max_rows, positions, one_prompt, options.on_forward,
                               deterministic=options.deterministic, longest=longest)
        backend = with_prompt_cache(backend, cache)
        stack.enter_context(contextlib.closing(backend))
        backends = [backend]
        if options.reference is not None:
            backends.append(
                stack.enter_context(
                    contextlib.closing(open_backend(options.reference, max_rows, positions, one_prompt,
                                                    deterministic=options.deterministic))
                )
            )

        def admit(joining: list[BatchItem], prefilled: torch.Tensor | None = None) -> list[torch.Tensor]:
            """The joining rows' logits: ``prefilled`` in the last pass (:func:`_forward`), or now."""
            if one_prompt:
                return [b.admit_copies(joining[0].prompt_ids, len(joining)) for b in backends]
            prompts = [item.prompt_ids for item in joining]
            if prefilled is not None:
                admitted = [prefilled]
            else:
                whole = _whole(joining)
                admitted = [b.admit(prompts, whole) if b.reused is not None else b.admit(prompts) for b in backends]
            if backend.reused is not None:  # a prompt cache's: how much each prompt took from it
                for item, reused in zip(joining, backend.reused, strict=True):
                    item.stats.note(cache=CacheReuse(reused=reused, prefilled=len(item.prompt_ids) - reused))
            return admitted

        def joins(joining: list[BatchItem]) -> bool:
            """Whether the joining rows are prefilled in the running rows' next pass."""
            return (
                not one_prompt
                and len(backends) == 1
                and backend.joining is not None
                and backend.joining.joins([item.prompt_ids for item in joining], _whole(joining))
            )

        yield from run_rows(lm, backends, feed, first, max_rows, options, admit, joins=joins)  # type: ignore[arg-type]


def _whole(joining: list[BatchItem]) -> set[int]:
    """The joining requests that prefill their whole prompt whatever the cache holds."""
    return {i for i, item in enumerate(joining) if not item.cache_prompt}


def run_rows(
    lm: LoadedModel,
    backends: list[Backend],
    feed: Feed,
    joining: list[BatchItem],
    max_rows: int,
    options: DecodeOptions,
    admit: Callable[..., list[torch.Tensor]],
    retain: bool = False,
    joins: Callable[[list[BatchItem]], bool] | None = None,
) -> Generator[Record, None, list[Row]]:
    """The loop over open backends (the model's, then the reference's): ``admit`` prefills rows
    that join (or, given their logits, notes them); returns the rows that ended. ``retain``:
    finished rows keep their cache (a session's one row, continued by the next turn); the caller
    owns the backends. ``joins``: whether rows that join while others run are prefilled in the
    running rows' pass (a backend's ``joining``: a mixed batch)."""
    backend = backends[0]
    watched = WatchIndex.of([token for _, token in options.watch], lm.sample_device)
    reference_dtype = dtype_name(options.reference.dtype) if options.reference is not None else None
    rows: list[Row] = []
    ended: list[Row] = []
    step: StepInput | None = None
    prefilled: torch.Tensor | None = None  # the joining rows' logits, when the last pass prefilled them
    held = Held()
    while True:
        joining = joining or held.due(len(rows))
        if joining and prefilled is None:
            joining, admitted = yield from _admit_what_fits(admit, joining, len(rows), held)
            if not (joining or rows or held.items):  # the one that found no room alone failed: the next
                joining = feed.take(max_rows, wait=True)
                continue
        elif joining:
            admitted = admit(joining, prefilled)
        prefilled = None
        if joining:
            vocab = admitted[0].shape[-1]
            for item in joining:
                if backend.compile_s:
                    item.stats.note(compile_s=backend.compile_s)
            new = [start_row(lm, item, vocab, options.ignore_eos or item.ignore_eos,
                             tuple(dict.fromkeys((*options.watch, *item.watch))), reference_dtype,
                             deterministic=options.deterministic) for item in joining]  # fmt: skip
            step = _joined(step, rows, admitted)
            rows += new
            watched = _watch_index(options.watch, rows, watched, lm.sample_device)
        if not rows:
            if held.items:
                continue
            return ended
        assert step is not None
        top_n = max(options.top_n if row.item.top_n is None else row.item.top_n for row in rows)
        result = yield from sample_step(rows, step, top_n, watched, backend.agree, alone=options.deterministic)
        cancelled = feed.cancelled()
        yield from held.cancel(cancelled)
        for i, row in enumerate(rows):
            if not result.finished[i] and row.key in cancelled:
                result.finished[i] = True
                yield row.key, row.item.stats.summary("cancelled")
        for i in [i for i, done in enumerate(result.finished) if not done]:
            try:
                rows[i].advance(result.emitted[i], result.newest[i : i + 1], result.states[i])
            except RuntimeFailure as exc:  # this row's grammar failed, not the run
                result.finished[i] = True
                yield rows[i].key, RowFailed(rows[i].key, str(exc))
        staying = [i for i, done in enumerate(result.finished) if not done]
        for i, done in enumerate(result.finished):
            if done:
                rows[i].end(result.emitted[i])
                ended.append(rows[i])
        newest = result.newest
        if len(staying) < len(rows):
            rows, newest = _keep(backends, rows, newest, staying, retain)
        # A backend that cannot join takes the next wave once every row of the last one has left.
        room = _room(backend, rows, max_rows) and not held.items  # none is taken before those held back
        joining = feed.take(max_rows - len(rows), wait=not rows) if room else []
        if not rows:
            step = None
            continue
        fused = joining if joining and joins is not None and joins(joining) else []
        step, prefilled, rows, newest = yield from _forward_with_room(backends, rows, newest, fused, held, retain, ended)
        if held.items:  # the joining rows found no room in the pass: they wait (nothing else was taken)
            joining = []


@dataclass
class Held:
    """Requests taken from the feed that the backend's cache had no room for (:class:`NoRoom`):
    they wait until a row leaves (or, when none was running, until none is), and nothing new is
    taken before them."""

    items: list[BatchItem] = field(default_factory=list)
    running: int = 0  # the rows running when they were held back

    def hold(self, items: list[BatchItem], running: int) -> None:
        self.items, self.running = items, running

    def due(self, running: int) -> list[BatchItem]:
        """The items to try again now (taken from here), or none."""
        if not self.items or (running and running >= self.running):
            return []
        items, self.items = self.items, []
        return items

    def cancel(self, cancelled: frozenset[Any]) -> Iterator[Record]:
        """The cancelled ones end here, as a running row would."""
        for item in [item for item in self.items if item.key in cancelled]:
            self.items.remove(item)
            yield item.key, item.stats.summary("cancelled")


def _admit_what_fits(
    admit: Callable[..., list[torch.Tensor]], joining: list[BatchItem], running: int, held: Held
) -> Generator[Record, None, tuple[list[BatchItem], list[torch.Tensor]]]:
    """``admit`` the joining rows; returns those admitted and their logits. Where the cache has no
    room for them all (:class:`NoRoom`), they wait while rows run; with none running the first
    goes alone (the others wait for it to end), and fails if it finds no room even then."""
    try:
        return joining, admit(joining)
    except NoRoom:
        if running:
            held.hold(joining, running)
            return [], []
    first = joining[:1]
    held.hold(joining[1:], 1)
    try:
        return first, admit(first)
    except NoRoom as exc:
        held.running = 0
        yield first[0].key, RowFailed(first[0].key, f"{exc} (its prompt: {len(first[0].prompt_ids)} tokens)")
        return [], []


def _forward_with_room(
    backends: list[Backend],
    rows: list[Row],
    newest: torch.Tensor,
    fused: list[BatchItem],
    held: Held,
    retain: bool,
    ended: list[Row],
) -> Generator[Record, None, tuple[StepInput | None, torch.Tensor | None, list[Row], torch.Tensor]]:
    """:func:`_forward`, the joining rows ``fused`` into its pass, until the backend's cache has
    room for it (:class:`NoRoom`): the joining rows then wait for a row to leave (``held``), then
    the rows holding the most positions end, one at a time (a ``RowFailed`` each), and the others
    go on. Returns the step, the joining rows' logits, and the rows and newest tokens left."""
    while rows:
        try:
            step, prefilled = _forward(backends, rows, newest, [item.prompt_ids for item in fused], _whole(fused))
            return step, prefilled, rows, newest
        except NoRoom as exc:
            if fused:
                held.hold(fused, len(rows))
                fused = []
                continue
            worst = max(range(len(rows)), key=lambda i: rows[i].cached)
            row = rows[worst]
            yield row.key, RowFailed(row.key, f"{exc} (this request held {row.cached} positions, the most of any row)")
            row.end([])
            ended.append(row)
            rows, newest = _keep(backends, rows, newest, [i for i in range(len(rows)) if i != worst], retain)
    return None, None, rows, newest


def _keep(
    backends: list[Backend], rows: list[Row], newest: torch.Tensor, staying: list[int], retain: bool
) -> tuple[list[Row], torch.Tensor]:
    """The rows ``staying`` (and their newest tokens) after the others left: the backends drop
    the others' caches, unless none stays and ``retain`` (a session's row, continued next turn)."""
    if not (retain and not staying):
        for b in backends:
            b.keep(staying)
    return [rows[i] for i in staying], newest[staying] if staying else newest[:0]


def _room(backend: Backend, rows: list[Row], max_rows: int) -> bool:
    """Whether requests may be admitted now."""
    return len(rows) < max_rows and (backend.can_join or not rows)


def _joined(step: StepInput | None, rows: list[Row], admitted: list[torch.Tensor]) -> StepInput:
    """The next step's input with the newly admitted rows' prefill logits after the others'."""
    if step is None or not rows:
        reference = admitted[1] if len(admitted) > 1 else None
        return StepInput(admitted[0], list(range(admitted[0].shape[0])), reference)
    at = step.logits.shape[0]
    starts = step.starts + [at + i for i in range(admitted[0].shape[0])]
    reference = None
    if step.reference is not None:
        reference = torch.cat([step.reference, admitted[1].to(step.reference.device)])
    return StepInput(torch.cat([step.logits, admitted[0]]), starts, reference)


def _forward(
    backends: list[Backend], rows: list[Row], newest: torch.Tensor, prompts: list[list[int]], whole: set[int]
) -> tuple[StepInput, torch.Tensor | None]:
    """Roll back what the last pass rejected, draft, and feed every row its newest token (and
    drafts): a one-token step when nobody drafts, else one ragged verification pass; with
    ``prompts`` (rows about to join; ``whole``: those that may not start from a cached prefix),
    one pass of the backend's that prefills them too, and their logits (else None)."""
    backend = backends[0]
    for i, row in enumerate(rows):
        if row.cached > len(row.text.seq) - 1:
            for b in backends:
                b.rollback(i, len(row.text.seq) - 1)
            row.cached = len(row.text.seq) - 1
    alone = not backend.splits_ragged or len(rows) == 1  # else only rows whose text follows their lengths draft
    drafts = [row.propose(len(rows), alone) for row in rows] if backend.ragged else [[] for _ in rows]
    if not any(drafts) and not prompts:
        outputs = [b.step(newest) for b in backends]
        for row in rows:
            row.cached += 1
        return StepInput(outputs[0], list(range(len(rows))), outputs[1] if len(outputs) > 1 else None), None
    fed = [[row.text.seq[-1], *draft] for row, draft in zip(rows, drafts, strict=True)]
    starts = list(itertools.accumulate((len(f) for f in fed[:-1]), initial=0))
    if prompts or (len(backends) == 1 and backend.joining is not None):
        # One backend (``joins`` said so, or nobody joins): its logits in fed order already, not
        # padded to the longest row and gathered back (two copies of every row's logits).
        assert backend.joining is not None
        flat, prefilled = backend.joining.forward_joining(fed, prompts, whole)
        _fed(rows, fed)
        return StepInput(flat, starts), prefilled if prompts else None
    outputs = [b.verify(fed) for b in backends]
    _fed(rows, fed)
    width = outputs[0].shape[1]
    index = torch.tensor([i * width + j for i, f in enumerate(fed) for j in range(len(f))], device=outputs[0].device)
    flat = [out.reshape(-1, out.shape[-1])[index.to(out.device)] for out in outputs]
    return StepInput(flat[0], starts, flat[1] if len(flat) > 1 else None), None


def _fed(rows: list[Row], fed: list[list[int]]) -> None:
    """The rows' caches hold what the pass fed them (counted once it succeeded: a pass that
    found no room left them as they were)."""
    for row, tokens in zip(rows, fed, strict=True):
        row.cached += len(tokens)


def _watch_index(
    run: Sequence[tuple[str, int]], rows: list[Row], index: WatchIndex | None, device: torch.device
) -> WatchIndex | None:
    """The ids every step reads the figures of: the run's ``--watch`` and each row's own (a
    server's rows each ask their own); ``index`` kept while they are the same."""
    ids = tuple(dict.fromkeys(token for _, token in (*run, *(pair for row in rows for pair in row.item.watch))))
    if index is not None and index.ids == ids:
        return index
    return WatchIndex.of(ids, device)
