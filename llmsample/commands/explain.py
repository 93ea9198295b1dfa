"""``llmsample explain``: the sampler chain for the next token, or a continuation scored."""

from __future__ import annotations

from typing import Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.model_options import load_model_with_progress, model_options, placement_options
from llmsample.commands.option_group import check_utf8_option
from llmsample.commands.options import (
    format_option,
    html_option,
    no_color_option,
    prompt_options,
    quiet_option,
    read_prompt,
)
from llmsample.commands.sampling_options import (
    constraint_options,
    resolve_sampling,
    resolve_watch,
    sampling_options,
    watch_option,
)

MAX_DEPTH, MAX_WIDTH, MAX_LEAVES = 6, 5, 256


def check_views(options: dict[str, Any]) -> None:
    """One view at a time, and a tree small enough to show: user errors before the model loads."""
    from llmsample.errors import UserError

    if options["tree"] and (options["layers"] or options["continuation"] is not None):
        raise UserError("--tree is a view of its own; leave out --layers and --continuation")
    if options["watch"] and (options["tree"] or (options["continuation"] is not None and not options["layers"])):
        raise UserError("--watch shows tokens in the next-token and --layers tables, not in --continuation's or --tree's")
    if options["html"] and not (options["layers"] or options["tree"]):
        raise UserError("--html draws --layers or --tree; add one of them")
    leaves = options["tree_width"] ** (options["tree"] or 0)
    if leaves > MAX_LEAVES:
        raise UserError(
            f"--tree {options['tree']} --tree-width {options['tree_width']} is {leaves} leaves, more than "
            f"{MAX_LEAVES}; make it shallower or narrower"
        )


@click.command(cls=GroupedCommand)
@prompt_options
@model_options
@placement_options
@sampling_options
@constraint_options
@click.option(
    "--continuation",
    metavar="TEXT",
    callback=check_utf8_option,
    help="Score this continuation token by token (teacher forcing).",
)
@click.option("--top-n", type=click.IntRange(1, 100), help="Candidates to show.  [default: 10; 5 with --layers]")
@click.option(
    "--layers",
    is_flag=True,
    help="The next token's rank and probability at every layer (the logit lens); after --continuation if given.",
)
@click.option(
    "--tree",
    type=click.IntRange(1, MAX_DEPTH),
    metavar="DEPTH",
    help=f"The most likely continuations as a tree, DEPTH tokens deep (at most {MAX_DEPTH}).",
)
@click.option(
    "--tree-width",
    type=click.IntRange(1, MAX_WIDTH),
    default=3,
    show_default=True,
    help=f"Branches per node of --tree (at most {MAX_WIDTH}).",
)
@watch_option
@format_option
@html_option
@no_color_option
@quiet_option()
@with_engine_options
def explain(**options: Any) -> None:
    """Show how the preset turns the model's next-token logits into the distribution it samples.

    \b
    llmsample explain -p "The capital of France is" --raw --preset creative
    llmsample explain -p "Say hi" --continuation "Hello there!" --preset code
    llmsample explain -p "The capital of France is" --raw --layers
    llmsample explain -p "Once upon a time" --raw --tree 3 --tree-width 2

    A warm engine of the same model (llmsample start) computes the next token's table and
    --continuation's instead of this process; --layers and --tree run here (--local).
    """
    from llmsample.client.engine_client import IN_PROCESS
    from llmsample.client.route import choose
    from llmsample.commands.host_options import open_engine
    from llmsample.jobs import Explanation, Job

    preset, cfg = resolve_sampling(options)
    check_views(options)
    views = [flag for flag, key in (("--layers", "layers"), ("--tree", "tree")) if options[key]]
    if views:
        choose({**options, "watch": None}, views)  # refused in one line where a warm engine would run it
        show_view(options, cfg)
        return
    engine = open_engine({**options, "watch": None})  # --watch runs there; before torch: the warm path stays light
    prompt = read_prompt(options["prompt"], options["raw"])
    job = Job(prompt, cfg, preset, options["system"], options["raw"], options["truncate"], options["top_n"] or 10,
              model=options["model"])  # fmt: skip
    asked = Explanation(job, options["continuation"], tuple(options["watch"] or ()))
    answer = engine.explain(asked)
    if engine.where != IN_PROCESS and not options["quiet"]:
        from llmsample.client.connection import say

        say(f"explained by the engine at {engine.where}")
    show_answer(answer, preset, options)


def show_view(options: dict[str, Any], cfg: Any) -> None:
    """``--layers`` or ``--tree``, in this process (the model's layers, the tree's passes)."""
    from llmsample.analysis.explain import continuation_ids
    from llmsample.commands.explain_views import show_layers, show_tree
    from llmsample.engine.prompt import encode_prompt
    from llmsample.terminal import stdout_console, use_color

    prompt = read_prompt(options["prompt"], options["raw"])
    lm = load_model_with_progress(options)
    watch = resolve_watch(options, lm)
    prompt_ids = encode_prompt(lm, prompt, options["system"], options["raw"], options["truncate"], cfg.max_tokens)
    console = stdout_console(use_color(options["no_color"]))
    ids = continuation_ids(lm, options["continuation"]) if options["continuation"] is not None else []
    if options["layers"]:
        show_layers(options, lm, prompt, prompt_ids, ids, cfg, [token for _, token in watch], console)
    else:
        show_tree(options, lm, prompt, prompt_ids, console)


def show_answer(answer: Any, preset: str, options: dict[str, Any]) -> None:
    """The next token's table or the continuation's (or their JSON lines), wherever it was computed."""
    from llmsample.render.jsonout import strict_json
    from llmsample.terminal import stdout_console, use_color

    if isinstance(answer, list):
        if options["fmt"] == "jsonl":
            for token in answer:
                click.echo(strict_json(token.to_dict()))
        else:
            stdout_console(use_color(options["no_color"])).print(continuation_table(answer, preset))
    elif options["fmt"] == "jsonl":
        click.echo(strict_json(answer.to_dict()))
    else:
        stdout_console(use_color(options["no_color"])).print(chain_table(answer, preset))


def chain_table(report: Any, preset: str) -> Any:
    """Candidates by row, stages by column, fitting 80 columns: a stage that changed nothing for
    these candidates (a filter that is off, a temperature of 1) gets no column, only its count."""
    from rich.table import Table
    from rich.text import Text

    from llmsample.render.inspect import visible
    from llmsample.sampling.stages import label

    shown = [
        name
        for i, name in enumerate(report.stages)
        if i in (0, len(report.stages) - 1)
        or report.kept[name] != report.kept[report.stages[i - 1]]
        or any(c.probs[name] != c.probs[report.stages[i - 1]] for c in report.candidates)
    ]
    table = Table(title=f"next token under preset {preset!r}", box=None, pad_edge=False, header_style="bold")
    table.add_column("token", overflow="fold", max_width=14)
    for name in shown:
        table.add_column(label(name), justify="right")
    table.add_column("removed by")
    for candidate in report.candidates:
        cells = []
        for name in shown:
            p = candidate.probs[name]
            cells.append(Text("–", style="dim") if p == 0 else Text(f"{p:.3f}"))
        removed = label(candidate.removed_by) if candidate.removed_by else ""
        table.add_row(visible(candidate.text), *cells, Text(removed, style="bold #d55e00"))
    lines = ["candidates left:"]
    for item in (f"{label(n)} {report.kept[n]}" for n in report.stages):
        if len(lines[-1]) + 2 + len(item) > 78:
            lines.append("")
        lines[-1] += (" " if lines[-1].endswith(":") else "  ") + item if lines[-1] else item
    lines.append(f"entropy of the final distribution: {report.entropy:.2f} bits")
    if "xtc" in report.stages:
        lines.append("XTC removes its candidates only when it fires; its column is the mix sampled")
    table.caption = "\n".join(lines)
    return table


def continuation_table(scored: list[Any], preset: str) -> Any:
    from rich.table import Table
    from rich.text import Text

    from llmsample.render.inspect import visible
    from llmsample.sampling.stages import label

    table = Table(title=f"continuation under preset {preset!r}", box=None, pad_edge=False, header_style="bold")
    for name, justify in (("#", "right"), ("token", "left"), ("p model", "right"), ("p preset", "right"),
                          ("rank", "right"), ("allowed", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")
    for token in scored:
        allowed = Text("yes") if token.allowed else Text(f"no ({label(token.removed_by)})", style="bold #d55e00")
        table.add_row(
            str(token.index),
            visible(token.text),
            f"{token.model_prob:.4f}",
            f"{token.prob:.4f}",
            str(token.model_rank),
            allowed,
        )
    never = [t for t in scored if not t.allowed]
    table.caption = (
        "this preset could have written every token"
        if not never
        else f"this preset could never write this: {len(never)} token(s) are filtered out"
    )
    return table
