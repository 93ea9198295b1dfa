"""The slash commands of ``llmsample chat``. A command that cannot be done (unknown, a bad
value, nothing to act on) is one line, and the conversation goes on."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmsample.chat.conversation import Conversation, load, save, settings_of
from llmsample.chat.talk import Chat, escape
from llmsample.client.connection import EngineGone
from llmsample.errors import OutputFailed, RuntimeFailure, UserError
from llmsample.sampling.config import ConfigError, SamplingConfig

EXIT = object()  # what /exit returns: leave the chat


def run_command(chat: Chat, line: str) -> object | None:
    """Do one ``/command args`` line; returns :data:`EXIT` to leave."""
    name, _, args = line[1:].strip().partition(" ")
    command = ALIASES.get(name.lower(), name.lower())
    entry = COMMANDS.get(command)
    if entry is None:
        chat.note(f"unknown command /{name}; /help lists them")
        return None
    if command in NEEDS_MODEL and chat.lm is None:
        chat.note(f"/{command} needs the model in this process; start the chat with --local for it")
        return None
    try:
        return entry[0](chat, args.strip())
    except (OutputFailed, EngineGone):  # the chat ends: its output has nowhere to go, or its engine went away
        raise
    except (UserError, RuntimeFailure) as exc:
        chat.note(str(exc))
    return None


def _help(chat: Chat, args: str) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_header=False)
    for name, (_, usage, text) in COMMANDS.items():
        table.add_row(f"/{name}{' ' + usage if usage else ''}", text)
    table.caption = 'A message between lines of """ may span several lines; Ctrl-C stops a reply, Ctrl-D leaves.'
    chat.console().print(table)


def _exit(chat: Chat, args: str) -> object:
    return EXIT


def parse_value(key: str, text: str) -> Any:
    """``/set``'s value: JSON where it parses (numbers, lists), else the text as given; ``none``
    clears the seed; ``TOKEN=BIAS`` for a logit bias, as on the command line."""
    if key == "seed" and text.lower() in ("none", "random"):
        return None
    if key == "logit_bias":
        pairs = []
        for item in text.split():
            token, sep, bias = item.rpartition("=")
            try:
                pairs.append((token, float(bias)) if sep else (item, None))
            except ValueError:
                pairs.append((item, None))
        return tuple(pairs)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def setting_text(key: str, value: Any) -> str:
    """A setting as the user would type it after ``/set KEY`` (not Python's repr): ``none``, a
    number, JSON for texts and lists, ``TOKEN=BIAS`` pairs for the logit bias."""
    if value is None:
        return "none"
    if key == "logit_bias":
        pairs = value.items() if isinstance(value, dict) else value  # as_dict() gives a table
        return " ".join(f"{token}={bias:g}" for token, bias in pairs) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(list(value) if isinstance(value, tuple) else value, ensure_ascii=False)


def _set(chat: Chat, args: str) -> None:
    if not args:
        return _show_settings(chat)
    key, _, text = args.partition(" ")
    key = key.replace("-", "_")
    if key not in SamplingConfig.keys() or key == "description":  # noqa: SIM118
        raise UserError(f"/set: unknown key {key!r}; /set alone lists the keys and their values")
    if not text.strip():
        raise UserError(f"/set {key}: give a value, e.g. /set {key} {setting_text(key, getattr(chat.cfg, key))}")
    try:
        chat.cfg = dataclasses.replace(chat.cfg, **{key: parse_value(key, text.strip())})
    except (ConfigError, TypeError, ValueError) as exc:
        raise UserError(f"/set {key}: {getattr(exc, 'reason', exc)}") from exc
    chat.note(f"{key} = {setting_text(key, getattr(chat.cfg, key))}")


def _show_settings(chat: Chat) -> None:
    from rich.table import Table

    table = Table(title=f"settings (from preset {chat.preset!r})", box=None, pad_edge=False, show_header=False)
    for key, value in chat.cfg.as_dict().items():
        if key != "description":
            table.add_row(key, escape(setting_text(key, value)))
    chat.console().print(table)


def _preset(chat: Chat, args: str) -> None:
    from llmsample.sampling import presets

    if not args:
        raise UserError(f"/preset: give a preset name (now {chat.preset!r}); `llmsample presets list` lists them")
    chat.preset, chat.cfg = presets.load(args)
    chat.note(f"preset {chat.preset}: {chat.cfg.description}".rstrip(": "))


def _system(chat: Chat, args: str) -> None:
    chat.conversation.system = args or None
    chat.note(f"system message: {args}" if args else "no system message")


def _regen(chat: Chat, args: str) -> None:
    chat.regen()


def _undo(chat: Chat, args: str) -> None:
    chat.note("dropped the last exchange" if chat.undo() else "nothing to undo")


def _clear(chat: Chat, args: str) -> None:
    chat.conversation.turns.clear()
    chat.note("cleared the conversation (the system message stays)")


def _save(chat: Chat, args: str) -> None:
    if not args:
        raise UserError("/save: give a file name, e.g. /save chat.jsonl")
    header = {"model": chat.model_name, "preset": chat.preset, "settings": chat.cfg.as_dict()}
    save(Path(args), chat.conversation, header)
    chat.note(f"saved {len(chat.conversation.turns)} exchange(s) to {args}")


def _load(chat: Chat, args: str) -> None:
    if not args:
        raise UserError("/load: give a file written by /save")
    load_into(chat, Path(args))


def load_into(chat: Chat, path: Path) -> Conversation:
    """A saved chat replaces this one: its turns, system message, preset and settings."""
    header, conversation = load(path)
    chat.cfg = settings_of(header, path, 1)
    chat.preset = str(header.get("preset") or chat.preset)
    chat.conversation = conversation
    chat.note(f"loaded {len(conversation.turns)} exchange(s) from {path}")
    return conversation


def _last(chat: Chat) -> Any:
    return chat._last_reply()


def _position(chat: Chat, text: str, command: str) -> int:
    reply = _last(chat)
    if not text.isdigit() or int(text) >= len(reply.events):
        raise UserError(f"{command}: give a token position of the last reply, 0..{len(reply.events) - 1} (/inspect)")
    return int(text)


def _inspect(chat: Chat, args: str) -> None:
    from llmsample.render.inspect import removed_legend, token_table

    reply = _last(chat)
    console = chat.console()
    console.print(token_table(reply.events))
    console.print(removed_legend(reply.events))


def _explain(chat: Chat, args: str) -> None:
    n = _position(chat, args, "/explain")
    chat.console().print(chat.views.chain_table(chat.explain_at(n), chat.preset))


def resolve_token(chat: Chat, text: str, at: Any = None) -> int:
    """A token as the user names it: ``#k`` the k-th alternative at ``at``, an id, or a one-token text."""
    from llmsample.sampling.vocabulary import Vocabulary

    if text.startswith("#") and at is not None:
        alternatives = [c.token_id for c in at.top if c.token_id != at.token_id]
        if not text[1:].isdigit() or not 1 <= int(text[1:]) <= len(alternatives):
            raise UserError(f"{text}: the alternatives at this position are #1..#{len(alternatives)} (/inspect)")
        return alternatives[int(text[1:]) - 1]
    vocabulary = Vocabulary.of(chat.lm.tokenizer, chat.lm.model.config.vocab_size, chat.lm.eos_ids)
    try:
        return vocabulary.token_id(text)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def _branch(chat: Chat, args: str) -> None:
    position, _, token = args.partition(" ")
    if not token:
        raise UserError("/branch: give a position and a token, e.g. /branch 3 #1 (the first alternative at 3)")
    n = _position(chat, position, "/branch")
    chat.branch(n, resolve_token(chat, token, _last(chat).events[n]))


def _watch(chat: Chat, args: str) -> None:
    if not args:
        shown = ", ".join(repr(name) for name in chat.watch) or "nothing"
        chat.note(f"watching {shown}; /watch TOKEN adds one, /watch off stops")
        return
    if args != "off":
        resolve_token(chat, args)  # one that is no token is refused now, not at every reply
    chat.watch = () if args == "off" else tuple(dict.fromkeys((*chat.watch, args)))
    chat.note(f"watching {args}" if chat.watch else "watching nothing")


def _stats(chat: Chat, args: str) -> None:
    totals = chat.totals
    limit = chat.context_limit
    cached = chat.cached_positions()
    held = f"cache holds {cached}{f' of {limit}' if limit else ''} positions" if cached is not None else (
        f"the engine keeps the cache{f' (context {limit})' if limit else ''}")  # fmt: skip
    prompt = f"prompt tokens {totals.reused} cached, {totals.prefilled} prefilled · " if cached is not None else ""
    ttft = (
        f"first token {totals.ttfts[0]:.2f} s at the first reply, {totals.ttfts[-1]:.2f} s at the last"
        if totals.ttfts
        else "no reply yet"
    )
    chat.console().print(
        f"{len(chat.conversation.turns)} exchange(s) · {totals.replies} replies · {totals.tokens} tokens generated "
        f"in {totals.seconds:.2f} s · {prompt}{held} · {ttft}",
        highlight=False,
    )


COMMANDS: dict[str, tuple[Callable[[Chat, str], Any], str, str]] = {
    "help": (_help, "", "this list (also /?)"),
    "set": (_set, "[KEY VALUE]", "change a sampling setting (validated as in presets); alone: show them"),
    "preset": (_preset, "NAME", "take a preset's settings"),
    "system": (_system, "[TEXT]", "set (or, alone, clear) the system message"),
    "regen": (_regen, "", "the last reply again, with a new seed"),
    "undo": (_undo, "", "drop the last exchange"),
    "clear": (_clear, "", "drop every exchange"),
    "save": (_save, "FILE", "save the conversation with its settings and seeds (JSON lines)"),
    "load": (_load, "FILE", "continue a saved conversation"),
    "inspect": (_inspect, "", "the last reply's per-token table"),
    "explain": (_explain, "N", "the sampler chain at token N of the last reply"),
    "branch": (_branch, "N TOKEN", "take TOKEN (text, id or #k: k-th alternative) at N and go on from there"),
    "watch": (_watch, "[TOKEN|off]", "report a token's probability at every step"),
    "stats": (_stats, "", "tokens, speed and cache use so far"),
    "exit": (_exit, "", "leave (also /bye, /quit, Ctrl-D, or exit or quit alone at a terminal)"),
}
NEEDS_MODEL = frozenset({"branch", "watch"})
"""What a chat on a warm engine cannot do: each reads the model, its tokenizer or its session."""
ALIASES = {"?": "help", "bye": "exit", "quit": "exit", "q": "exit"}  # Ollama's /bye and /?, llm's quit
