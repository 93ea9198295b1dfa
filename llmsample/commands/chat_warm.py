"""``chat`` on a warm engine: each reply a job with the whole conversation as messages (the
engine renders them with the chat template, and its prompt cache keeps the conversation's
prefix warm), streamed through the same renderers as in-process, so a piped session prints the
same transcript; ``/explain`` is the engine's, ``/stats`` counts what came back. What reads
the model itself (``/branch``, ``/watch``, ``--replay``) says in one line that it needs ``--local``. A chat outlives its engine's
keep-alive: this user's engine found stopped when a line comes is started again."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from llmsample.chat.conversation import Conversation
from llmsample.chat.talk import Chat, ChatSettings, Totals, Views
from llmsample.client.connection import Target
from llmsample.errors import UserError
from llmsample.events import RunStats
from llmsample.sampling.config import SamplingConfig


class EngineChat(Chat):
    """A :class:`Chat` whose replies the engine at ``target`` decodes; no model here."""

    def __init__(
        self, target: Target, name: str, preset: str, cfg: SamplingConfig, settings: ChatSettings, views: Views,
        context_length: int | None = None,
    ) -> None:  # fmt: skip
        self.target, self.name, self.context_length = target, name, context_length
        self.load_options: dict[str, Any] | None = None  # this user's engine: what starts it again
        self.ngram: tuple[int, int] | None = None  # --draft ngram: drafted on the engine
        self.lm = None  # type: ignore[assignment]  # the engine's
        self.preset, self.cfg, self.settings, self.drafter, self.views = preset, cfg, settings, None, views
        self.conversation = Conversation(settings.system or None)
        self.totals = Totals()
        self.legend_shown = False
        self.last_summary = None
        self.log_thread = None

    @property
    def model_name(self) -> str:
        return self.name

    @property
    def context_limit(self) -> int | None:
        return self.context_length

    def cached_positions(self) -> int | None:
        return None  # the engine's prompt cache keeps the conversation's prefix

    def explain_at(self, position: int) -> Any:
        """The engine's answer, computed as in-process (:func:`~llmsample.analysis.explain.explain_reply`)
        on the reply's own prompt: the conversation before it, fitted to the same room."""
        from llmsample.client.engine_client import RemoteEngine
        from llmsample.jobs import Explanation, Job

        reply = self._last_reply()
        cfg, limit = reply.settings, self.context_length or 0
        job = Job("", cfg, self.preset, top_n=10, messages=self.conversation.messages()[:-1], model=self.name,
                  fit_room=min(cfg.max_tokens, limit // 2))  # fmt: skip
        return RemoteEngine(self.target).explain(Explanation(job, reply=tuple(reply.ids[:position])))

    def _decode(
        self, cfg: SamplingConfig, prefix: list[int], stats: RunStats
    ) -> tuple[list[int], Generator[Any, None, None]]:
        """The conversation's messages as a job; the prompt's ids stay the engine's (nothing here
        reads them). The engine drops the oldest exchanges to leave the reply room in its context,
        as in-process (the same room, the same function); this conversation drops them too."""
        from llmsample.jobs import Job

        if prefix:
            raise UserError("forcing tokens into a reply needs the model in this process; start the chat with --local")
        limit = self.context_length or 0
        job = Job("", cfg, self.preset, top_n=self.settings.top_n, messages=self.conversation.messages(),
                  model=None if self.target.where.startswith("unix:") else self.name, ngram=self.ngram,
                  draft_tokens=self.settings.draft_tokens if self.ngram else None,
                  fit_room=min(cfg.max_tokens, limit // 2), ignore_eos=self.settings.ignore_eos)  # fmt: skip
        records, dropped = self._admitted(job)
        if dropped:
            del self.conversation.turns[:dropped]
            self.note(f"dropped the {dropped} oldest exchange(s) to fit the context of {limit} tokens")
        return [], _pairs(records)

    def _admitted(self, job: Any) -> tuple[Iterator[Any], int]:
        """The reply's row on the engine. This user's engine gone (its keep-alive ran out while
        the chat waited, or it was stopped) is started again, saying so; a server given by
        --host gone ends the chat in one line saying how to go on."""
        from llmsample.client.connection import EngineGone, Target, chat_job, say
        from llmsample.commands.engines import running_engine
        from llmsample.errors import RuntimeFailure

        try:
            return chat_job(self.target, job, say)
        except EngineGone as exc:
            if self.load_options is None:
                raise EngineGone(f"{exc}; {self._going_on()}") from None
        keep = self.target.keep_alive_s
        why = "" if keep is None else f" (its keep-alive: {keep:g} s without work; or llmsample stop)"
        say(f"the engine for {self.name} has stopped{why}; starting it again")
        try:
            record, _ = running_engine({**self.load_options, "batch_size": None, "max_queue": None, "quiet": True}, keep)
        except RuntimeFailure as exc:
            raise EngineGone(f"{exc}; {self._going_on()}") from None
        self.target = Target(record.where, name=record.name, deterministic=record.deterministic,
                             keep_alive_s=record.keep_alive_s)  # fmt: skip
        return chat_job(self.target, job, say)

    def _going_on(self) -> str:
        """How to pick the conversation up again, once an engine answers."""
        if self.log_thread is None:
            return "this line was not answered (with --no-log, `llmsample chat -c` cannot continue this chat)"
        return "this line was not answered; `llmsample chat -c` continues the conversation"

    def close(self) -> None:
        pass  # the engine keeps its own cache


def _pairs(records: Iterator[Any]) -> Generator[Any, None, None]:
    """The job's records as the session's ``(key, record)`` pairs; closing it closes the
    connection, and the engine cancels the row (a Ctrl-C)."""
    try:
        for record in records:
            yield 0, record
    finally:
        records.close()


def start_on(target: Target, options: dict[str, Any], views: Views, settings: ChatSettings) -> EngineChat:
    """The chat on ``target``: the engine's model must have a chat template, as in-process."""
    from llmsample.client.connection import engine_status
    from llmsample.client.route import hosted
    from llmsample.commands.sampling_options import resolve_sampling

    preset, cfg = resolve_sampling(options)
    status = engine_status(target)
    name = status["model"]
    if not target.where.startswith("unix:") and options["model"] and options["model"] != name:
        raise UserError(f"model {options['model']!r} is not served at {target.where}; it runs {name!r}")
    if status.get("chat_template") is False:
        raise UserError(f"{name} has no chat template, so it cannot chat; use `llmsample generate --raw` with it")
    chat = EngineChat(target, name, preset, cfg, settings, views, status.get("context_length"))
    if hosted(options) is None:  # this user's engine, found by the model options
        chat.load_options = options
    if options["draft"] == "ngram":
        chat.ngram = (options["ngram_min"], options["ngram_max"])
    return chat
