"""A chat's turns, as the chat template sees them and as a file keeps them (JSON lines).

A reply keeps the ids it was decoded after, its tokens' events (for ``/inspect``), the tokens
forced before the sampled ones (``/branch``), its seed and its settings: with those a saved
conversation replays to the same replies."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import UserError
from llmsample.files import replace_whole
from llmsample.sampling.config import ConfigError, SamplingConfig

if TYPE_CHECKING:
    from llmsample.events import TokenEvent
    from llmsample.models.loading import LoadedModel

FORMAT_VERSION = 1


@dataclass
class Reply:
    """An assistant turn: ``events`` are all its tokens, the forced ones (source ``forced``) too."""

    prompt_ids: list[int]
    events: list[TokenEvent]
    text: str
    seed: int
    settings: SamplingConfig
    stop_reason: str
    prefix: list[int] = field(default_factory=list)  # forced before the sampled tokens (/branch)
    ignore_eos: bool = False  # decoded past end-of-sequence (--ignore-eos): its replay must be too
    logged: int | None = None  # its run in the run log

    @property
    def ids(self) -> list[int]:
        return [event.token_id for event in self.events]


@dataclass
class Turn:
    user: str
    reply: Reply | None = None
    saved: dict[str, Any] | None = None  # a loaded reply's record (its text, seed, settings, prefix)

    @property
    def reply_text(self) -> str | None:
        if self.reply is not None:
            return self.reply.text
        return None if self.saved is None else str(self.saved.get("content", ""))


@dataclass
class Conversation:
    system: str | None = None
    turns: list[Turn] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        """The chat template's input: the system message, then each exchange so far."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for turn in self.turns:
            out.append({"role": "user", "content": turn.user})
            if (text := turn.reply_text) is not None:
                out.append({"role": "assistant", "content": text})
        return out

    def fit(self, lm: LoadedModel, room: int) -> tuple[list[int], int]:
        """The rendered conversation with ``room`` positions left for the reply, dropping the
        oldest exchanges after the system message until it fits; returns (ids, exchanges dropped)."""
        from llmsample.engine.prompt import fit_exchanges

        ids, dropped = fit_exchanges(lm, self.messages(), room)
        del self.turns[:dropped]
        return ids, dropped


def save(path: Path, conversation: Conversation, header: dict[str, Any]) -> None:
    """One JSON object a line: the chat's header (model, preset, settings, system), then each
    user turn and each reply with its seed, settings and forced prefix."""
    lines = [{"type": "chat", "version": FORMAT_VERSION, **header, "system": conversation.system}]
    for turn in conversation.turns:
        lines.append({"type": "user", "content": turn.user})
        if turn.reply is not None:
            reply = turn.reply
            lines.append(
                {"type": "assistant", "content": reply.text, "seed": reply.seed, "settings": reply.settings.as_dict(),
                 "prefix": reply.prefix, "token_ids": reply.ids, "stop_reason": reply.stop_reason,
                 "ignore_eos": reply.ignore_eos}
            )  # fmt: skip
        elif turn.saved is not None:
            lines.append(turn.saved)
    write_whole(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


def write_whole(path: Path, text: str) -> None:
    """All of ``text`` or nothing (:func:`~llmsample.files.replace_whole`): an earlier save stays whole."""
    try:
        replace_whole(path, text.encode("utf-8"))
    except OSError as exc:
        kept = f"{path} is as it was" if path.exists() else "nothing was written"
        reason = exc.strerror or exc
        raise UserError(f"cannot write {path} ({reason}); {kept}: make room or choose another file") from exc


def load(path: Path) -> tuple[dict[str, Any], Conversation]:
    """A saved chat: its header and its turns (replies as saved records, replayable)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise UserError(f"{path} does not exist; give a file written by /save") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path} ({exc}); give a file written by /save") from exc
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}, line {number}: not JSON ({exc.msg}); give a file written by /save") from exc
        except RecursionError as exc:
            raise UserError(f"{path}, line {number}: nested too deeply; give a file written by /save") from exc
        if not isinstance(record, dict) or record.get("type") not in ("chat", "user", "assistant"):
            raise UserError(f"{path}, line {number}: not a chat record; give a file written by /save")
        check_fields(record, f"{path}, line {number}")
        records.append((number, record))
    if not records or records[0][1]["type"] != "chat":
        raise UserError(f"{path} does not start with a chat header; give a file written by /save")
    header = records[0][1]
    conversation = Conversation(system=header.get("system") or None)
    for number, record in records[1:]:
        if record["type"] == "user":
            conversation.turns.append(Turn(record.get("content") or ""))
        elif not conversation.turns or conversation.turns[-1].saved is not None:
            raise UserError(f"{path}, line {number}: a reply without its user turn; give a file written by /save")
        else:
            settings_of(record, path, number)  # fail on bad settings now, not at replay
            conversation.turns[-1].saved = record
    return header, conversation


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def _is_seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


# What each record's fields must be, as /save writes them ((what, test, required)): a file edited
# by hand fails at /load in one line, not later in the template or at replay.
FIELDS: dict[str, dict[str, tuple[str, Callable[[Any], bool], bool]]] = {
    "chat": {
        "system": ("a string", lambda v: isinstance(v, str), False),
        "preset": ("a string", lambda v: isinstance(v, str), False),
        "settings": ("an object", lambda v: isinstance(v, dict), False),
    },
    "user": {"content": ("a string", lambda v: isinstance(v, str), False)},
    "assistant": {
        "content": ("a string", lambda v: isinstance(v, str), False),
        "seed": ("an integer in [0, 2^63)", _is_seed, True),
        "settings": ("an object", lambda v: isinstance(v, dict), False),
        "prefix": ("a list of token ids", _is_ids, False),
        "token_ids": ("a list of token ids", _is_ids, False),
        "ignore_eos": ("true or false", lambda v: isinstance(v, bool), False),
    },
}


def check_fields(record: dict[str, Any], where: str) -> None:
    """Each field the record's type has is of the type /save writes (null: left out)."""
    for key, (what, test, required) in FIELDS[record["type"]].items():
        value = record.get(key)
        if value is None and not required:
            continue
        if value is None or not test(value):
            shown = "missing" if value is None else f"{json.dumps(value)[:40]}"
            raise UserError(f"{where}: {key} must be {what}, got {shown}; give a file written by /save")


def settings_of(record: dict[str, Any], path: Path | str = "the file", number: int = 0) -> SamplingConfig:
    """A saved record's settings as a config, checked as a preset's are."""
    try:
        return SamplingConfig.from_mapping(dict(record.get("settings") or {}))
    except (ConfigError, TypeError, ValueError) as exc:
        raise UserError(f"{path}, line {number}: bad settings ({exc})") from exc
