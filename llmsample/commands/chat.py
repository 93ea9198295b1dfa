"""``llmsample chat``: a conversation that keeps its cache, coloured by probability, with slash
commands to regenerate, undo and branch (the work is in :mod:`llmsample.chat`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.model_options import model_options, placement_options
from llmsample.commands.option_group import check_utf8_option
from llmsample.commands.options import deterministic_option, draft_options, keeps_log, log_option, output_options
from llmsample.commands.sampling_options import constraint_options, resolve_sampling, resolve_watch, sampling_options
from llmsample.errors import UserError


@click.command(cls=GroupedCommand)
@click.option("--system", metavar="TEXT", callback=check_utf8_option, help="The system message.")
@click.option(
    "--load",
    "load_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Continue a conversation saved with /save.",
)
@click.option(
    "-c",
    "--continue",
    "resume",
    is_flag=True,
    help="Continue the last conversation kept in the run log (`llmsample logs`).",
)
@click.option(
    "--replay", is_flag=True, help="With --load or -c: decode every saved reply again with its seed and settings."
)
@model_options
@placement_options
@sampling_options
@constraint_options
@output_options
@draft_options
@deterministic_option(None, "on with --replay")
@log_option
@with_engine_options
def chat(**options: Any) -> None:
    """Talk with a chat model: each reply streams coloured by probability, the conversation's
    cache is kept between turns, and slash commands regenerate, undo, branch and inspect.

    \b
    llmsample chat
    llmsample chat --preset creative --system "You are terse."
    printf 'Hi\\nWhat is 2+2?\\n' | llmsample chat --preset deterministic
    llmsample chat --load saved.jsonl --replay
    llmsample chat -c

    Every reply is kept in the run log (`llmsample logs`) unless --no-log. A warm engine of the
    same model (llmsample start) decodes the replies.
    """
    from llmsample.commands.host_options import open_engine

    if options["replay"] and options["load_file"] is None and not options["resume"]:
        raise UserError("--replay decodes a saved conversation again; give it with --load FILE or -c")
    if options["resume"] and options["load_file"] is not None:
        raise UserError("-c continues the last logged conversation and --load a saved one; give one of them")
    if options["deterministic"] is None:
        options["deterministic"] = options["replay"]
    engine = open_engine(options, ["--replay"] if options["replay"] else None, restart=True)
    from llmsample.chat.logged import last_conversation, new_conversation
    from llmsample.chat.repl import converse
    from llmsample.chat.slash import load_into
    from llmsample.chat.talk import ChatSettings, Views
    from llmsample.commands.explain import chain_table
    from llmsample.commands.generate import build_renderers

    resumed = last_conversation() if options["resume"] else None  # before the model loads: none is one line
    from llmsample.chat.talk import Chat
    from llmsample.jobs import engine_drafter

    settings = ChatSettings(
        options["system"], options["top_n"], options["ignore_eos"], options["draft_tokens"],
        options["quiet"], options["fmt"], options["no_color"],
        (options["ngram_min"], options["ngram_max"]) if options["draft"] == "ngram" else None,
        engine_drafter(options["draft"]),
    )  # fmt: skip
    views = Views(lambda quiet: build_renderers({**options, "quiet": quiet}), chain_table)
    preset, cfg = resolve_sampling(options)
    talk = Chat(engine, preset, cfg, settings, views, tuple(options.get("watch") or ()))
    if talk.lm is not None and talk.watch:
        resolve_watch(options, talk.lm)  # a watched text that is no token: one line now, not at every reply
    talk.log_thread = new_conversation() if keeps_log(options) else None
    try:
        if options["load_file"] is not None:
            load_into(talk, options["load_file"])
        if resumed is not None:
            continue_from(talk, *resumed)
        if options["replay"]:
            replay(talk)
        if options["system"] is not None:
            talk.conversation.system = options["system"] or None
        interactive = sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty()
        converse(talk, interactive)
    finally:
        talk.close()


def continue_from(talk: Any, thread: str, model: str, conversation: Any) -> None:
    """``-c``: the logged conversation's turns and system message (unless --system), the same id."""
    talk.conversation = conversation
    if talk.log_thread is not None:
        talk.log_thread = thread
    elsewhere = "" if model == talk.model_name else f" (its replies came from {model})"
    talk.note(f"continuing the last conversation: {len(conversation.turns)} exchange(s){elsewhere}")


def replay(talk: Any) -> None:
    """Every saved reply decoded again; a line for each that differs (where, and why), then the count."""
    from llmsample.chat.reply_replay import summary_line

    for line in summary_line(talk.replay()):
        talk.note(line)
