"""One chat on an engine (this process's or a warm one: one program), its conversation, the
settings, and how a reply is decoded and shown. Every reply is a turn on the engine with the
whole conversation (plus forced tokens for ``/branch``); the engine keeps the conversation's
cache between turns, so only what changed is prefilled."""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llmsample.chat.conversation import Conversation, Reply, Turn, settings_of
from llmsample.errors import UserError
from llmsample.events import Candidate, RunStats, Summary, TokenEvent
from llmsample.sampling.config import fresh_seed

if TYPE_CHECKING:
    from rich.console import Console

    from llmsample.analysis.explain_records import ChainReport
    from llmsample.chat.reply_replay import Replayed
    from llmsample.client.engine_client import EngineClient
    from llmsample.models.loading import LoadedModel
    from llmsample.sampling.config import SamplingConfig


@dataclass
class Totals:
    """``/stats``: the chat so far."""

    replies: int = 0
    tokens: int = 0
    reused: int = 0
    prefilled: int = 0
    seconds: float = 0.0
    ttfts: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Views:
    """How replies and chains are shown, handed down by the command (``generate``'s renderers
    for its flags, quiet or not; ``explain``'s chain table), so that chat shows exactly what
    they show."""

    renderers: Callable[[bool], list[Any]]
    chain_table: Callable[[Any, str], Any]


@dataclass(frozen=True)
class ChatSettings:
    """The command's flags a chat reads, typed by the command: its decoding (``top_n``,
    ``ignore_eos``, ``--draft`` as a job's ``ngram`` or ``drafter``, ``draft_tokens``) and where
    its own lines go (``quiet``, ``fmt``, ``no_color``)."""

    system: str | None = None
    top_n: int = 0
    ignore_eos: bool = False
    draft_tokens: int | None = None
    quiet: bool = False
    fmt: str = "text"
    no_color: bool = False
    ngram: tuple[int, int] | None = None
    drafter: str | None = None


class Chat:
    """``engine``: where the replies decode (its model must have a chat template);
    ``settings``: the command's display and decoding flags; ``watch``: tokens every reply's
    records follow (``--watch``, ``/watch``)."""

    def __init__(
        self,
        engine: EngineClient,
        preset: str,
        cfg: SamplingConfig,
        settings: ChatSettings,
        views: Views,
        watch: tuple[str, ...] = (),
    ) -> None:
        status = engine.status()
        if status.get("chat_template") is False:
            raise UserError(f"{status['model']} has no chat template, so it cannot chat; "
                            "use `llmsample generate --raw` with it")  # fmt: skip
        self.engine, self.name = engine, status["model"]
        self.preset, self.cfg, self.settings, self.views, self.watch = preset, cfg, settings, views, watch
        self.conversation = Conversation(settings.system or None)
        self.totals = Totals()
        self.legend_shown = False
        self.last_summary: Summary | None = None
        self.log_thread: str | None = None  # the conversation's id in the run log (None: not kept)

    @property
    def lm(self) -> LoadedModel | None:
        """The model where it runs in this process (``/branch``, ``/watch``, ``--replay`` read it)."""
        return self.engine.local_model()

    def _local(self, what: str) -> LoadedModel:
        lm = self.lm
        if lm is None:
            raise UserError(f"{what} needs the model in this process; start the chat with --local for it")
        return lm

    # -- what the slash commands and the REPL call --------------------------------------------

    def say(self, text: str) -> Reply | None:
        """A user turn and its reply."""
        self.conversation.turns.append(Turn(text))
        try:
            reply = self._answer([], self._seed())
        except BaseException:  # a message too long, a failed run: the conversation is as before
            self.conversation.turns.pop()
            raise
        if reply is None:
            self.conversation.turns.pop()
        return reply

    def regen(self) -> Reply | None:
        """The last reply again, with a new seed."""
        turns = self.conversation.turns
        if not turns or turns[-1].reply_text is None:
            raise UserError("there is no reply in this chat yet to regenerate; say something first")
        old = turns[-1].reply, turns[-1].saved
        turns[-1].reply = turns[-1].saved = None
        return self._kept_unless_interrupted(old, [], fresh_seed())

    def branch(self, position: int, token: int) -> Reply | None:
        """The last reply up to ``position``, then ``token``, then sampled on from there with the
        reply's own seed and settings (a branch taken twice is the same branch)."""
        reply = self._last_reply()
        if not 0 <= position < len(reply.events):
            raise UserError(f"/branch: the last reply has tokens 0..{len(reply.events) - 1}; got {position}")
        kept = [
            *reply.events[:position],
            forced_event(
                self._local("/branch"), reply.events[position], token, position, reply.prompt_ids[-1:] + reply.ids[:position]
            ),
        ]
        self.conversation.turns[-1].reply = None
        return self._kept_unless_interrupted((reply, None), kept, reply.seed, reply.settings)

    def _kept_unless_interrupted(self, old: tuple[Reply | None, Any], *answer: Any) -> Reply | None:
        """A new take on the last reply; the old one stays when the new one shows nothing."""
        try:
            reply = self._answer(*answer)
        finally:
            turn = self.conversation.turns[-1]
            if turn.reply is None:
                turn.reply, turn.saved = old
        return reply

    def replay(self) -> list[Replayed]:
        """A loaded conversation's replies decoded again with their seeds and settings, each after
        the saved conversation before it (a reply that differs does not carry into the next), and
        none of them kept in the run log; interrupted replies are skipped (where the interrupt
        landed is not in the seed)."""
        from llmsample.chat.reply_replay import Replayed, compare

        lm = self._local("--replay")
        results: list[Replayed] = []
        turns, thread, self.log_thread = self.conversation.turns, self.log_thread, None
        flags = self.settings
        try:
            for number, turn in enumerate(turns, 1):
                record = turn.saved
                if record is None:
                    continue
                if record.get("stop_reason") == "interrupted":
                    results.append(Replayed(number, None, "interrupted"))
                    continue
                self.conversation.turns = [*turns[: number - 1], Turn(turn.user)]
                prefix = [int(t) for t in record.get("prefix") or []]
                ids, _ = self.conversation.fit(lm, 0)
                events = [forced_event(lm, None, t, i, ids[-1:] + prefix[:i]) for i, t in enumerate(prefix)]
                ran_past_eos = bool(record.get("ignore_eos", flags.ignore_eos))  # a save from before the field: the flag
                self.settings = dataclasses.replace(flags, ignore_eos=ran_past_eos)
                reply = self._answer(events, int(record["seed"]), settings_of(record))
                results.append(compare(lm, number, record, reply))
        finally:
            self.conversation.turns, self.log_thread, self.settings = turns, thread, flags
        return results

    def undo(self) -> bool:
        if not self.conversation.turns:
            return False
        self.conversation.turns.pop()
        return True

    def close(self) -> None:
        self.engine.close()

    # -- decoding and showing a reply ---------------------------------------------------------

    def _last_reply(self) -> Reply:
        turns = self.conversation.turns
        if not turns or turns[-1].reply is None:
            raise UserError("there is no reply in this chat yet to work on; say something first")
        return turns[-1].reply

    def _seed(self) -> int:
        return self.cfg.seed if self.cfg.seed is not None else fresh_seed()

    @property
    def model_name(self) -> str:
        return self.name

    @property
    def context_limit(self) -> int | None:
        return self.engine.status().get("context_length")

    def cached_positions(self) -> int | None:
        """Positions the conversation's cache holds (None: an engine's, not seen from here)."""
        return self.engine.status().get("cached_positions")

    def explain_at(self, position: int) -> ChainReport:
        """The sampler chain at token ``position`` of the last reply, as the reply saw it: the
        engine's answer (:func:`~llmsample.analysis.explain.explain_reply`) on the reply's own
        prompt, the conversation before it fitted to the same room."""
        from llmsample.jobs import Explanation

        reply = self._last_reply()
        job = self._job(reply.settings, self.conversation.messages()[:-1], (), top_n=10)
        return self.engine.explain(Explanation(job, watch=self.watch, reply=tuple(reply.ids[:position])))

    def _answer(self, kept: list[TokenEvent], seed: int, settings: SamplingConfig | None = None) -> Reply | None:
        """Decode the last turn's reply after the rendered conversation and ``kept`` tokens."""
        cfg = dataclasses.replace(settings or self.cfg, seed=seed)
        prefix = [event.token_id for event in kept]
        stats = RunStats(model=self.model_name, preset=self.preset, seed=seed)
        ids, records = self._decode(cfg, prefix, stats)
        events, summary = self._stream(records, stats, kept)
        if summary.stop_reason == "interrupted" and len(events) == len(kept):
            self.note("interrupted before the first token: nothing to keep")
            return None
        if summary.stop_reason == "interrupted":
            self.note("interrupted: what was shown is kept as the reply")
        ignore_eos = self.settings.ignore_eos
        reply = Reply(ids, events, summary.text, seed, cfg, summary.stop_reason, prefix, ignore_eos=ignore_eos)
        self.conversation.turns[-1].reply = reply
        self._count(summary)
        if self.log_thread is not None:
            from llmsample.chat.logged import keep_reply

            keep_reply(self.conversation, self.log_thread, reply, summary)
        return reply

    def _decode(self, cfg: SamplingConfig, prefix: list[int], stats: RunStats) -> tuple[list[int], Generator[Any, None, None]]:
        """The reply's prompt ids (where the engine is in this process) and its ``(key, record)``
        pairs. The engine drops the oldest exchanges to leave the reply room in its context; this
        conversation drops them too. An engine gone ends the chat in one line saying how to go on."""
        from llmsample.client.connection import EngineGone

        try:
            answered = self.engine.converse(self._job(cfg, self.conversation.messages(), tuple(prefix)))
        except EngineGone as exc:
            raise EngineGone(f"{exc}; {self._going_on()}") from None
        if answered.dropped:
            del self.conversation.turns[: answered.dropped]
            limit = self.context_limit or 0
            self.note(f"dropped the {answered.dropped} oldest exchange(s) to fit the context of {limit} tokens")
        return answered.prompt_ids or [], _pairs(answered.records)

    def _job(self, cfg: SamplingConfig, messages: list[dict[str, Any]], prefix: tuple[int, ...], top_n: int | None = None) -> Any:
        """A turn's job: the conversation, the room kept for the reply (and its forced start); its
        drafts from a pool of its own, so an undone exchange leaves none behind (``Job.own_pool``)."""
        from llmsample.jobs import Job

        settings, drafts = self.settings, self.settings.ngram or self.settings.drafter
        room = min(cfg.max_tokens, (self.context_limit or 0) // 2) + len(prefix)
        return Job("", cfg, self.preset, top_n=settings.top_n if top_n is None else top_n, messages=messages,
                   model=self.name, ngram=settings.ngram, drafter=settings.drafter,
                   draft_tokens=settings.draft_tokens if drafts else None, fit_room=room,
                   ignore_eos=settings.ignore_eos, watch=self.watch, prefix=prefix, own_pool=True)  # fmt: skip

    def _going_on(self) -> str:
        """How to pick the conversation up again, once an engine answers."""
        if self.log_thread is None:
            return "this line was not answered (with --no-log, `llmsample chat -c` cannot continue this chat)"
        return "this line was not answered; `llmsample chat -c` continues the conversation"

    def _stream(
        self, records: Generator[Any, None, None], stats: RunStats, kept: list[TokenEvent]
    ) -> tuple[list[TokenEvent], Summary]:
        """The reply live through ``generate``'s renderers; Ctrl-C stops it and keeps what was shown."""
        renderers = self._renderers()
        events: list[TokenEvent] = []
        summary = None
        guard = TokenGuard()

        def show(event: TokenEvent) -> None:
            with guard:
                for renderer in renderers:
                    renderer.token(event)
                events.append(event)

        previous = signal.signal(signal.SIGINT, guard.on_sigint)
        try:
            for event in kept:
                show(event)
            for _, record in records:
                if isinstance(record, Summary):
                    summary = record
                else:
                    show(dataclasses.replace(record, index=len(events)))
        except KeyboardInterrupt:
            summary = stats.summary("interrupted")
        finally:
            signal.signal(signal.SIGINT, previous)
            records.close()  # an interrupted turn: the session starts its cache afresh
        assert summary is not None
        text = "".join(event.text for event in events)
        summary = dataclasses.replace(summary, tokens=len(events) - len(kept), text=text)
        for renderer in renderers:
            renderer.summary(summary)
        sys.stdout.flush()
        if not self.settings.quiet:
            from llmsample.render.stream import print_summary
            from llmsample.terminal import stderr_console

            print_summary(stderr_console(), summary)
        return events, summary

    def _renderers(self) -> list[Any]:
        # The legend once, before the first reply; each reply gets fresh renderers (--inspect's table).
        from llmsample.render.stream import OneLineRenderer, PlainRenderer

        renderers = self.views.renderers(self.settings.quiet or self.legend_shown)
        self.legend_shown = True
        if sys.stdout.isatty():  # --no-color on a terminal: a person reads the replies as they are
            return renderers
        # Plain text for a script: a reply a line, its newlines escaped.
        return [OneLineRenderer(r.out) if type(r) is PlainRenderer else r for r in renderers]

    def _count(self, summary: Summary) -> None:
        totals, cache = self.totals, summary.facts.cache
        totals.replies += 1
        totals.tokens += summary.tokens
        totals.seconds += summary.elapsed_s
        if summary.ttft_s is not None:
            totals.ttfts.append(summary.ttft_s)
        if cache is not None:
            totals.reused += cache.reused
            totals.prefilled += cache.prefilled
        self.last_summary = summary

    # -- where the chat's own lines go ----------------------------------------------------------

    def note(self, text: str) -> None:
        """One dim line on stderr (summaries, what a command did)."""
        from llmsample.terminal import stderr_console

        stderr_console().print(f"[dim]{escape(text)}[/]")

    def console(self) -> Console:
        """Tables (``/inspect``, ``/explain``, ``/set``): stdout, or stderr when stdout is JSON lines."""
        from llmsample.terminal import stderr_console, stdout_console, use_color

        if self.settings.fmt == "jsonl":
            return stderr_console()
        return stdout_console(use_color(self.settings.no_color))


def _pairs(records: Iterator[Any]) -> Generator[Any, None, None]:
    """A turn's records as the session's ``(key, record)`` pairs; closing it closes the turn
    (in this process the session starts its cache afresh; elsewhere the connection closes and
    the engine cancels the row: a Ctrl-C)."""
    try:
        for record in records:
            yield 0, record
    finally:
        records.close()  # type: ignore[attr-defined]


class TokenGuard:
    """Ctrl-C stops a reply between tokens, never inside a token's printing: a token is either
    shown whole and part of the reply, or neither (rich would print a half-written one twice)."""

    def __init__(self) -> None:
        self.printing = self.pending = False

    def on_sigint(self, signum: int, frame: Any) -> None:
        if self.printing:
            self.pending = True
        else:
            raise KeyboardInterrupt

    def __enter__(self) -> None:
        self.printing = True

    def __exit__(self, *exc: object) -> None:
        self.printing = False
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def forced_event(lm: LoadedModel, at: TokenEvent | None, token: int, index: int, before: list[int]) -> TokenEvent:
    """A token put into a reply rather than drawn (``/branch``, a replayed prefix): its numbers
    are those of the alternative it was at ``at`` (zero where it was not among them; rank 0: unknown).
    ``before``: the ids before it, so that its text is spaced as a sampled token's would be."""
    candidate = next((c for c in (at.top if at else ()) if c.token_id == token), None)
    prob = candidate.prob if candidate else 0.0
    model_prob = candidate.model_prob if candidate else 0.0
    decode = lm.tokenizer.decode
    text = decode([*before, token])[len(decode(before)) :] if before else decode([token])  # its spacing
    top = at.top if at else (Candidate(token, lm.token_text(token), prob, model_prob),)
    return TokenEvent(
        index=index, token_id=token, text=text, prob=prob,
        model_prob=model_prob, model_rank=0, entropy=at.entropy if at else 0.0, top=top, removed={},
        source="forced",
    )  # fmt: skip
