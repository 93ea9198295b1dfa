"""``llmsample sweep``: settings × prompts × seeds decoded as one batch, measured, and drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.model_options import model_options
from llmsample.commands.options import prompt_cache_option, quiet_option
from llmsample.commands.sampling_options import resolve_sampling, sampling_options, sampling_overrides
from llmsample.errors import UserError

AXES = ("logprob", "judge_logprob", "entropy", "distinct_1", "distinct_2", "distinct_3", "self_bleu")


@click.command(cls=GroupedCommand)
@click.argument("prompts_path", metavar="PROMPTS", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--vary", multiple=True, metavar="KEY=V1,V2", help="A sampling key and its values; repeat for a grid.")
@click.option("--presets", metavar="A,B", help="Presets to sweep (times the --vary grid).")
@click.option("--settings", "settings_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A TOML file of named settings: [name] then preset and keys.")  # fmt: skip
@click.option("--seeds", type=click.IntRange(1, 10000), default=4, show_default=True,
              help="Samples per setting and prompt: seeds --seed, --seed+1, ... (the same under every setting).")  # fmt: skip
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Each sample's record (batch's, with its setting and metrics); resumes a partial file.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["table", "jsonl"]), default="table", show_default=True,
              help="Each setting's figures on stdout: a table, or one JSON line each.")  # fmt: skip
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Draw quality against diversity: .svg, .png, .pdf, or .html (as --html).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="A page of the plot whose points show their samples, coloured per token.")  # fmt: skip
@click.option("--x", "x_axis", type=click.Choice(AXES), default="distinct_2", show_default=True, help="Diversity axis.")
@click.option("--y", "y_axis", type=click.Choice(AXES), help="Quality axis [default: judge_logprob with --judge, else logprob].")
@click.option("--judge", metavar="MODEL", help="Also score every text under this model (perplexity under a second model).")
@click.option("--language", metavar="CODE",
              help="The language replies should be in (ISO 639-1: en, fr) [default: the prompts', detected].")  # fmt: skip
@click.option("--plan", is_flag=True, help="Print the sweep's batch lines and stop (llmsample batch runs them alike).")
@click.option("--top-n", type=click.IntRange(0, 100), default=5, show_default=True, help="Alternatives per token in the records.")
@click.option("--batch-size", type=click.IntRange(1, 1024), help="Rows decoded together [default: by memory].")
@prompt_cache_option
@model_options
@sampling_options
@quiet_option("progress")
@with_engine_options
def sweep(**options: Any) -> None:
    """Sweep sampling settings over prompts and seeds: which settings give coherent, varied text?

    PROMPTS (a file, or - for stdin) has one prompt per line, as batch reads them. Every setting
    decodes every prompt under the same seeds, as rows of one batch; each sample is measured
    (log-probability, entropy, repetition, loops, early ends, language) and each prompt's
    samples compared (distinct-n, self-BLEU). The flags of the Sampling group apply to every
    setting, under its own keys.

    \b
    llmsample sweep prompts.txt --vary temperature=0.6,0.9,1.2 --vary min_p=0,0.05,0.1 --plot sweep.svg
    llmsample sweep prompts.txt --presets balanced,creative,precise --seeds 8 -o samples.jsonl --html sweep.html
    llmsample sweep prompts.txt --settings studies.toml --judge HuggingFaceTB/SmolLM2-360M-Instruct
    """
    from llmsample.commands.batch import input_lines
    from llmsample.sweep.grid import plan, read_prompts, settings_of

    if options["preset_file"] is not None:
        raise UserError("--preset-file does not go with a sweep; name settings in --settings FILE.toml")
    resolve_sampling(options)  # bad flags and an unknown preset fail before anything runs
    base = {key: value for key, value in sampling_overrides(options).items() if value is not None and key != "seed"}
    presets = [name.strip() for name in (options["presets"] or "").split(",") if name.strip()]
    settings = settings_of(presets, options["vary"], options["settings_path"], options["preset"] or "balanced")
    prompts = read_prompts(input_lines(options["prompts_path"], "prompts"), options["prompts_path"])
    first = options["seed"] if options["seed"] is not None else 0
    planned = plan(settings, prompts, range(first, first + options["seeds"]), base)
    if options["plan"] and options["output"] is not None:
        raise UserError("--plan prints the lines on stdout; leave out -o (batch -o runs them)")
    if options["plan"]:
        from llmsample.batch.result_lines import dumps

        for p in planned:
            click.echo(dumps(p.line))
        return
    from llmsample.commands.sweep_run import run

    run(options, settings, prompts, planned, base)

