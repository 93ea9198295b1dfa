"""``llmsample compare-presets``: one prompt, several presets, side by side, with numbers."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import engine_at, with_engine_options
from llmsample.commands.model_options import model_options, placement_options
from llmsample.commands.options import (
    deterministic_option,
    format_option,
    html_option,
    no_color_option,
    prompt_options,
    quiet_option,
    read_prompt,
)
from llmsample.commands.sampling_options import constraint_from, constraint_options
from llmsample.errors import UserError
from llmsample.render.numbers import format_number

if TYPE_CHECKING:
    from llmsample.analysis.preset_comparison import PresetAggregate, PresetRun, Rows
    from llmsample.client.engine_client import EngineClient


@click.command("compare-presets", cls=GroupedCommand)
@prompt_options
@model_options
@placement_options
@click.option("--presets", "names", metavar="A,B,...", help="Presets to compare [default: every preset].")
@click.option("--samples", type=click.IntRange(1, 64), default=1, show_default=True, help="Samples per preset.")
@click.option("--seed", type=int, default=0, show_default=True, help="Sample i uses seed S+i.")
@click.option(
    "--max-tokens", "-n", type=click.IntRange(1), default=128, show_default=True, help="Most tokens per sample."
)
@constraint_options
@format_option
@html_option
@no_color_option
@quiet_option()
@deterministic_option()
@with_engine_options
def compare_presets(**options: Any) -> None:
    """Run the same prompt through several presets (one model load) and compare them.

    \b
    llmsample compare-presets -p "Write a haiku about rain" --samples 3
    llmsample compare-presets -p "Sort a list in Python" --presets code,deterministic --format jsonl

    A warm engine of the same model (llmsample start) decodes the samples instead of this process.
    """
    from llmsample.analysis.preset_comparison import compare_rows
    from llmsample.client.route import choose
    from llmsample.render.jsonout import strict_json
    from llmsample.sampling import presets as preset_store

    if options["names"] is None:
        names = sorted(preset_store.discover())
    else:
        names = [n.strip() for n in options["names"].split(",") if n.strip()]
        if not names:
            raise UserError(
                "--presets is empty; name presets separated by commas (see `llmsample presets list`), "
                "or leave it out to compare every preset"
            )
    preset_store.check_names(names)  # before the model load
    check_seeds(options["seed"], options["samples"])
    constraint = constraint_from(options)  # a bad one fails before the model load
    configs = {name: cfg.with_overrides(constraint=constraint) for name, cfg in map(preset_store.load, names)}
    prompt = read_prompt(options["prompt"], options["raw"])
    target = choose(options)
    engine = engine_at(target, options)
    rows, model = sample_rows(engine, prompt, options), engine.model_name() or options["model"] or ""
    comparison = compare_rows(
        rows, model, configs, options["samples"], options["seed"], options["max_tokens"],
        progress=lambda total: progress_bar(total, options["quiet"]),
    )  # fmt: skip
    runs = comparison.runs
    if options["fmt"] == "jsonl":
        for run in runs:
            record = dataclasses.asdict(run.metrics)
            if run.interrupted:
                record["interrupted"] = True
            if run.failure:
                record["error"] = run.failure
            click.echo(strict_json(record))
    elif runs:
        show(runs, options["samples"], options["no_color"])
    if options["html"] and runs:
        from llmsample.render.html import compare_page, write_page

        write_page(options["html"], compare_page([(run.preset, run.sample, list(run.events)) for run in runs]))
    failed = [run for run in runs if run.failure]
    for run in failed:  # data went out above; each broken sample gets its one line
        click.echo(f"Error: {run.preset} sample {run.sample} (seed {run.seed}): {run.failure}", err=True)
    if comparison.exit_code or failed:
        raise click.exceptions.Exit(comparison.exit_code or 1)


def sample_rows(engine: EngineClient, prompt: str, options: dict[str, Any]) -> Rows:
    """A preset's samples as jobs, each decoded alone as ``generate`` decodes one: a row's
    numbers depend on the rows sharing its passes (llama.cpp's kernels sum in another order for
    one token than for several, docs/determinism.md), so the same seed gives ``generate``'s
    text here. With ``--deterministic`` every row is computed alone anyway: they share a batch."""
    from llmsample.jobs import Job

    def rows(cfg: Any, stats: list[Any], seeds: list[int | None]) -> Any:
        jobs = [Job(prompt, dataclasses.replace(cfg, seed=seed), row.preset, options["system"], options["raw"],
                    options["truncate"], model=options["model"]) for row, seed in zip(stats, seeds, strict=True)]  # fmt: skip
        return _refusals_raised(engine.run_many(jobs, rows=len(jobs) if options["deterministic"] else 1))

    return rows


def _refusals_raised(records: Iterator[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
    """Every sample shares the prompt: one the engine refuses (too long for the context) is the
    command's error, in one line; a row whose numbers broke is that sample's failure."""
    from llmsample.client.wire import Failed

    for index, record in records:
        if isinstance(record, Failed) and record.user_error:
            raise UserError(record.message)
        yield index, record


@contextlib.contextmanager
def progress_bar(total: int, quiet: bool) -> Iterator[Callable[[], None]]:
    """A transient bar on stderr over the preset runs (off with ``--quiet``)."""
    from rich.progress import Progress

    from llmsample.terminal import stderr_console

    with Progress(console=stderr_console(), transient=True, disable=quiet) as progress:
        task = progress.add_task("comparing presets", total=total)
        yield lambda: progress.advance(task)


def check_seeds(seed: int, samples: int) -> None:
    """Sample i uses seed S+i: the first and the last must both be seeds the config accepts."""
    from llmsample.sampling.config import ConfigError, SamplingConfig

    for sample in dict.fromkeys((0, samples - 1)):
        try:
            SamplingConfig(seed=seed + sample)
        except ConfigError as exc:
            which = "" if sample == 0 else f"sample {sample} uses seed S+{sample}, which "
            raise UserError(f"--seed: {which}{exc.reason}") from exc


METRIC_KEY = {
    "tokens": "tokens generated",
    "tok/s": "tokens per second",
    "logprob": "mean log-probability of the chosen tokens under the raw model (nats; nearer 0: likelier)",
    "ppl": "perplexity, exp(-logprob): the model's surprise per token",
    "entropy": "mean entropy of the distribution each token was drawn from (bits)",
    "dist-1": "distinct words: unique tokens over all tokens (1: no token twice)",
    "dist-2": "distinct pairs: unique token pairs over all pairs",
    "rep-4": "share of 4-token sequences that repeat an earlier one (0: no loops)",
    "diversity": "unique token pairs across the samples over all their pairs (1/samples: all the same)",
    "overlap": "mean share of token pairs two samples have in common (1: identical)",
    "diverges at": "first token where a sample leaves the greedy text (never: it is the greedy text)",
}
"""What each column of the metrics table means (printed under it)."""


def metric_rows(aggregates: dict[str, PresetAggregate], samples: int) -> dict[str, dict[str, str]]:
    """Per preset, each aggregate formatted for the table."""
    rows = {}
    for name, agg in aggregates.items():
        row = {
            "tokens": format_number(agg.tokens, 0),
            "tok/s": format_number(agg.tokens_per_s, 1),
            "logprob": format_number(agg.mean_logprob),
            "ppl": format_number(agg.perplexity),
            "entropy": format_number(agg.mean_entropy),
            "dist-1": format_number(agg.distinct_1),
            "dist-2": format_number(agg.distinct_2),
            "rep-4": format_number(agg.repetition_rate),
        }
        if samples > 1:
            row["diversity"] = format_number(agg.diversity)
            row["overlap"] = format_number(agg.overlap)
        row["diverges at"] = ",".join("never" if i is None else str(i) for i in agg.divergence)
        rows[name] = row
    return rows


def show(runs: list[PresetRun], samples: int, no_color: bool) -> None:
    """Outputs side by side (stacked when columns would be too narrow), then the metrics,
    transposed on narrow terminals so every number stays readable."""
    from rich.table import Table
    from rich.text import Text

    from llmsample.analysis.preset_comparison import aggregate
    from llmsample.render.bands import band_for
    from llmsample.render.stream import legend
    from llmsample.terminal import stdout_console, use_color

    console = stdout_console(use_color(no_color))
    texts: dict[str, Text] = {}
    for run in runs:
        if run.interrupted:
            texts.setdefault(run.preset, Text("[interrupted]\n", style="bold"))
        if run.failure:
            texts.setdefault(run.preset, Text()).append(f"[sample {run.sample} failed]\n", style="bold")
        cell = texts.setdefault(run.preset, Text())
        if samples > 1:
            cell.append(f"[sample {run.sample}, seed {run.seed}]\n", style="dim")
        for event in run.events:
            cell.append(event.text, style=band_for(event.prob).style)
        cell.append("\n")
    if console.width // len(texts) >= 24:
        side = Table(expand=True)
        for name in texts:
            side.add_column(name, ratio=1, overflow="fold")
        side.add_row(*texts.values())
        console.print(side)
    else:
        for name, text in texts.items():
            console.rule(name)
            console.print(text)
    console.print(legend("sampled"))
    rows = metric_rows(aggregate(runs), samples)
    headers = list(next(iter(rows.values())))
    table = Table(title="metrics (means over samples)", header_style="bold", pad_edge=False)
    if console.width >= 14 * len(headers):
        table.add_column("preset", no_wrap=True)
        for header in headers:
            table.add_column(header, justify="right")
        for name, row in rows.items():
            table.add_row(name, *row.values())
    else:
        table.add_column("metric", no_wrap=True)
        for name in rows:
            table.add_column(name, justify="right", overflow="fold")
        for header in headers:
            table.add_row(header, *(row[header] for row in rows.values()))
    console.print(table)
    key = Table(box=None, pad_edge=False, show_header=False, style="dim")
    for header in headers:
        key.add_row(header, METRIC_KEY[header], style="dim")
    console.print(key)
