"""``llmsample compare-presets``: one prompt, several presets, side by side, with numbers."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import click

from llmsample.commands.options import html_option, load_model_with_progress, model_options, prompt_options, read_prompt
from llmsample.errors import Interrupted, UserError, ignore_further_interrupts


@click.command("compare-presets")
@prompt_options
@model_options
@click.option("--presets", "names", metavar="A,B,...", help="Presets to compare [default: every preset].")
@click.option("--samples", type=click.IntRange(1, 64), default=1, show_default=True, help="Samples per preset.")
@click.option("--seed", type=click.IntRange(0, 2**62), default=0, show_default=True, help="Sample i uses seed S+i.")
@click.option("--max-tokens", "-n", type=click.IntRange(1), default=128, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text", show_default=True)
@html_option
@click.option("--no-color", is_flag=True, help="No colour (also: NO_COLOR=1).")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def compare_presets(**options: Any) -> None:
    """Run the same prompt through several presets (one model load) and compare them.

    \b
    llmsample compare-presets -p "Write a haiku about rain" --samples 3
    llmsample compare-presets -p "Sort a list in Python" --presets code,deterministic --format jsonl
    """
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
    configs = dict(preset_store.load(name) for name in names)
    prompt = read_prompt(options["prompt"], options["raw"])
    lm = load_model_with_progress(options)
    from llmsample.engine.prompt import encode_prompt

    prompt_ids = encode_prompt(
        lm, prompt, options["system"], options["raw"], options["truncate"], options["max_tokens"]
    )
    runs, code = compare(
        lm, prompt_ids, configs, options["samples"], options["seed"], options["max_tokens"], options["quiet"]
    )
    if options["fmt"] == "jsonl":
        for _, summary, metrics in runs:
            record = dataclasses.asdict(metrics)
            if summary.stop_reason == "interrupted":
                record["interrupted"] = True
            click.echo(strict_json(record))
    elif runs:
        show(runs, options["samples"], options["no_color"])
    if options["html"] and runs:
        from llmsample.render.html import compare_page, write_page

        write_page(options["html"], compare_page([(m.preset, m.sample, events) for events, _, m in runs]))
    if code:
        raise click.exceptions.Exit(code)


def compare(
    lm: Any, prompt_ids: Any, configs: dict[str, Any], samples: int, seed: int, max_tokens: int, quiet: bool
) -> tuple[list[Any], int]:
    """Every preset's samples as one batch each, plus a greedy run for the divergence index.
    Returns the runs and an exit code: on Ctrl-C, SIGTERM or SIGHUP the presets that finished
    are kept, the interrupted one with what it had (its summaries say ``interrupted``), and the
    code is 130 (143, 129)."""
    from rich.progress import Progress

    from llmsample.analysis.metrics import sample_metrics
    from llmsample.engine.loop import generate as generate_events
    from llmsample.engine.loop import generate_rows, run_to_end
    from llmsample.events import RunStats, Summary
    from llmsample.sampling.config import SamplingConfig
    from llmsample.terminal import stderr_console

    greedy_cfg = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
    runs: list[Any] = []
    try:
        greedy_run = generate_events(lm, prompt_ids, greedy_cfg, RunStats(lm.name, "greedy", None))
        greedy = [e.token_id for e in run_to_end(greedy_run)[0]]
    except (KeyboardInterrupt, Interrupted) as exc:  # before any preset: nothing to show
        ignore_further_interrupts()
        return runs, exc.exit_code if isinstance(exc, Interrupted) else 130
    code = 0
    with Progress(console=stderr_console(), transient=True, disable=quiet) as progress:
        task = progress.add_task("comparing presets", total=len(configs))
        for name, base in configs.items():
            cfg = dataclasses.replace(base, max_tokens=max_tokens, seed=seed)
            seeds = [seed + i for i in range(samples)]
            stats = [RunStats(lm.name, name, s) for s in seeds]
            events: list[list[Any]] = [[] for _ in seeds]
            summaries: dict[int, Summary] = {}
            try:
                for row, item in generate_rows(lm, prompt_ids, cfg, stats, seeds):
                    if isinstance(item, Summary):
                        summaries[row] = item
                    else:
                        events[row].append(item)
            except (KeyboardInterrupt, Interrupted) as exc:
                ignore_further_interrupts()
                code = exc.exit_code if isinstance(exc, Interrupted) else 130
            for row in range(samples):
                # An interrupted row: its summary says so and counts the tokens it kept.
                summary = summaries.get(row) or dataclasses.replace(
                    stats[row].summary("interrupted"),
                    text="".join(e.text for e in events[row]),
                    tokens=len(events[row]),
                )
                runs.append((events[row], summary, sample_metrics(name, row, events[row], summary, greedy)))
            if code:
                break
            progress.advance(task)
    return runs, code


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def metric_rows(runs: list[Any], samples: int) -> dict[str, dict[str, str]]:
    """Per preset, each metric formatted (means over samples)."""
    from llmsample.analysis.metrics import cross_sample_diversity, mean_pairwise_overlap

    by_preset: dict[str, list[Any]] = {}
    for run in runs:
        by_preset.setdefault(run[2].preset, []).append(run)
    rows = {}
    for name, preset_runs in by_preset.items():
        metrics = [m for _, _, m in preset_runs]

        def mean(key: str, values: list[Any] = metrics) -> float | None:
            xs = [getattr(m, key) for m in values if getattr(m, key) is not None]
            return statistics.fmean(xs) if xs else None

        row = {
            "tokens": _fmt(mean("tokens"), 0),
            "tok/s": _fmt(mean("tokens_per_s"), 1),
            "logprob": _fmt(mean("mean_logprob")),
            "ppl": _fmt(mean("perplexity")),
            "entropy": _fmt(mean("mean_entropy")),
            "dist-1": _fmt(mean("distinct_1")),
            "dist-2": _fmt(mean("distinct_2")),
            "rep-4": _fmt(mean("repetition_rate")),
        }
        if samples > 1:
            token_lists = [[e.token_id for e in events] for events, _, _ in preset_runs]
            row["diversity"] = _fmt(cross_sample_diversity(token_lists))
            row["overlap"] = _fmt(mean_pairwise_overlap(token_lists))
        row["diverges at"] = ",".join(
            "never" if m.divergence_index is None else str(m.divergence_index) for m in metrics
        )
        rows[name] = row
    return rows


def show(runs: list[Any], samples: int, no_color: bool) -> None:
    """Outputs side by side (stacked when columns would be too narrow), then the metrics,
    transposed on narrow terminals so every number stays readable."""
    from rich.table import Table
    from rich.text import Text

    from llmsample.render.bands import band_for
    from llmsample.render.stream import legend
    from llmsample.terminal import stdout_console, use_color

    console = stdout_console(use_color(no_color))
    texts: dict[str, Text] = {}
    for events, summary, metrics in runs:
        if summary.stop_reason == "interrupted":
            texts.setdefault(metrics.preset, Text("[interrupted]\n", style="bold"))
        cell = texts.setdefault(metrics.preset, Text())
        if samples > 1:
            cell.append(f"[sample {metrics.sample}, seed {metrics.seed}]\n", style="dim")
        for event in events:
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
    rows = metric_rows(runs, samples)
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
