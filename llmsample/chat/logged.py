"""A chat in the run log: each kept reply is a run of its own (command ``chat``), with the
conversation it belongs to and the run of the reply before it, so that ``chat -c`` finds the
last conversation as it stood at its last reply (a regenerated reply or a branch is a sibling
of the one it replaced, and the chain through parents skips it)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from llmsample.chat.conversation import Conversation, Turn
from llmsample.errors import UserError

if TYPE_CHECKING:
    from llmsample.chat.conversation import Reply
    from llmsample.events import Summary
    from llmsample.logs.store import LoggedRun


def new_conversation() -> str:
    """A fresh conversation's id in the log."""
    return secrets.token_hex(6)


def log_id(turn: Turn) -> int | None:
    """The run that kept ``turn``'s reply (None: not kept, or not from the log)."""
    if turn.reply is not None:
        return turn.reply.logged
    saved = turn.saved or {}
    return saved.get("log_id") if isinstance(saved.get("log_id"), int) else None


def keep_reply(conversation: Conversation, thread: str, reply: Reply, summary: Summary) -> None:
    """The last turn's reply into the log, after the run of the reply before it."""
    from llmsample.logs.recorder import LogRecorder

    turns = conversation.turns
    parent = log_id(turns[-2]) if len(turns) > 1 else None
    flags = {"ignore_eos": True} if reply.ignore_eos else {}
    recorder = LogRecorder("chat", turns[-1].user, reply.settings.as_dict(), conversation.system, thread, parent, flags)
    for event in reply.events:
        recorder.token(event)
    recorder.summary(summary)
    reply.logged = recorder.run_id


def last_conversation() -> tuple[str, str, Conversation]:
    """The newest conversation in the log as it stood at its last reply: its id, its model and its
    turns (each reply a saved record: ``--replay`` decodes it again)."""
    from llmsample.logs.store import database_path, last_conversation

    runs = last_conversation()
    if not runs:
        raise UserError(f"no chat in the log ({database_path()}) to continue; start one with `llmsample chat`")
    conversation = Conversation(system=runs[-1].system)
    conversation.turns = [Turn(run.prompt, saved=reply_record(run)) for run in runs]
    return str(runs[-1].conversation), runs[-1].model, conversation


def reply_record(run: LoggedRun) -> dict[str, Any]:
    """A logged reply as ``/save`` writes one: the tokens before its sampled ones (``/branch``'s
    kept and forced ones; the summary counts the sampled) are its prefix."""
    ids = [int(record["token_id"]) for record in run.records]
    forced = len(ids) - run.tokens
    return {
        "type": "assistant", "content": run.text, "seed": run.seed, "settings": run.settings, "prefix": ids[:forced],
        "token_ids": ids, "token_probs": [record.get("prob") for record in run.records], "stop_reason": run.stop_reason,
        "log_id": run.id,
        **({} if run.flags is None else {"ignore_eos": bool(run.flags.get("ignore_eos"))}),  # None: logged before flags
    }  # fmt: skip
