"""``llmsample compare-models``: one text scored by two models, token by token."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.model_options import check_device, load_model_with_progress
from llmsample.commands.option_group import check_utf8_option
from llmsample.commands.options import (
    format_option,
    html_option,
    no_color_option,
    prompt_options,
    quiet_option,
    read_prompt,
)
from llmsample.commands.sampling_options import SAMPLING_KEYS, resolve_sampling, sampling_options
from llmsample.errors import Interrupted, UserError, ignore_further_interrupts

if TYPE_CHECKING:
    from torch import Tensor

    from llmsample.models.loading import LoadedModel
    from llmsample.sampling.config import SamplingConfig

DEFAULT_NAME = "default"  # -m default: the default model (SmolLM2-135M-Instruct)


@click.command("compare-models", cls=GroupedCommand)
@prompt_options
@click.option(
    "--model",
    "-m",
    "models",
    multiple=True,
    metavar="ID|DIR",
    help="Give it twice: A, then B. 'default' is the default model.",
)
@click.option(
    "--device", default="auto", show_default=True, callback=check_device, help="auto, cpu, cuda, cuda:N or mps (both)."
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    default="auto",
    show_default=True,
    help="For both models; auto: bfloat16 on CUDA, float32 on CPU and MPS.",
)
@click.option(
    "--backend-a",
    type=click.Choice(["auto", "transformers", "llama.cpp", "torch"]),
    default="transformers",
    show_default=True,
    help="A's backend; llama.cpp runs a GGUF model, torch llmsample's own forward (see generate --backend).",
)
@click.option(
    "--backend-b",
    type=click.Choice(["auto", "transformers", "llama.cpp", "torch"]),
    default="transformers",
    show_default=True,
    help="B's backend: -m default twice with --backend-b llama.cpp measures llama.cpp's kernels against transformers.",
)
@sampling_options
@click.option(
    "--continuation",
    metavar="TEXT",
    callback=check_utf8_option,
    help="Score this text instead of generating one with A.",
)
@format_option
@html_option
@no_color_option
@quiet_option("legend or progress")
def compare_models(**options: Any) -> None:
    """Score one text under two models and show, per token, how far B's next-token distribution
    drifts from A's: KL(A‖B) in nats, whether the top tokens agree, and both probabilities.

    A generates the text (any preset and sampling flags), or --continuation gives it. The two
    models must share a tokenizer: a model and its quantized copy, a fine-tune, a draft and its target.

    \b
    llmsample compare-models -m MODEL -m QUANTIZED_COPY -p "Explain top-p" --seed 1
    llmsample compare-models -m BIG -m SMALL -p "Say hi" --continuation "Hello there!" --format jsonl
    """
    from llmsample.analysis.drift import model_drift, scorable
    from llmsample.engine.prompt import encode_prompt

    specs = options["models"]
    if len(specs) != 2:
        raise click.UsageError(
            f"give two models, -m A -m B ({len(specs)} given; '{DEFAULT_NAME}' names the default model)"
        )
    given = options["continuation"]
    if given is not None:
        check_no_sampling_flags(options)
        if not given.strip():
            raise UserError("--continuation is empty; give the text to score")
    else:
        from llmsample.sampling.config import fresh_seed

        preset, cfg = resolve_sampling(options)
        if cfg.seed is None:  # a fresh seed, reported in the summary so the run can be repeated
            cfg = dataclasses.replace(cfg, seed=fresh_seed())
    prompt = read_prompt(options["prompt"], options["raw"])
    lm_a, lm_b = load_pair(options, specs)
    room = 0 if given is not None else cfg.max_tokens
    prompt_ids = encode_prompt(lm_a, prompt, options["system"], options["raw"], options["truncate"], room)
    if given is not None:
        continuation = lm_a.tokenizer(given, add_special_tokens=False)["input_ids"]
        if not continuation:
            raise UserError("--continuation has no tokens; give the text to score")
        extra: dict[str, Any] = {}
    else:
        continuation, stop_reason, code = generate_with(lm_a, prompt_ids, cfg, preset, options["quiet"])
        if not continuation:  # interrupted before A wrote anything
            raise click.exceptions.Exit(code)
        extra = {"preset": preset, "seed": cfg.seed, "stop_reason": stop_reason}
    if "llama.cpp" in (lm_a.backend, lm_b.backend):
        extra = {**extra, "backend_a": lm_a.backend, "backend_b": lm_b.backend}
    _, note = scorable(lm_a, lm_b, prompt_ids, continuation)
    if note is not None:  # a padded vocabulary: A wrote an id B lacks (or the reverse)
        click.echo(f"Note: {note}", err=True)
    tokens, summary = model_drift(
        lm_a, lm_b, prompt_ids, continuation, source="given" if given is not None else "generated", extra=extra
    )
    show(tokens, summary, options)
    if given is None and code:
        raise click.exceptions.Exit(code)


def check_no_sampling_flags(options: dict[str, Any]) -> None:
    """With --continuation nothing is sampled: a sampling flag would be silently ignored."""
    named = [key for key in (*SAMPLING_KEYS, "preset", "preset_file") if options.get(key) is not None]
    if options.get("stop"):
        named.append("stop")
    if named:
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in named)
        raise click.UsageError(f"{flags} only apply when A generates the text; leave them out with --continuation")


def load_pair(options: dict[str, Any], specs: tuple[str, ...]) -> tuple[LoadedModel, LoadedModel]:
    """Both models once (the same one twice is loaded once), on one device in one dtype."""
    from llmsample.engine.speculative import check_same_tokenizer

    resolved = [None if spec == DEFAULT_NAME else spec for spec in specs]
    backends = (options.get("backend_a", "transformers"), options.get("backend_b", "transformers"))
    lm_a = load_model_with_progress({**options, "model": resolved[0], "compile_model": False, "backend": backends[0]})
    if resolved[1] == resolved[0] and backends[1] == backends[0]:
        return lm_a, lm_a
    lm_b = load_model_with_progress({**options, "model": resolved[1], "compile_model": False, "backend": backends[1]})
    try:
        check_same_tokenizer(lm_b, lm_a)
    except UserError as exc:
        raise UserError(
            f"{lm_b.name!r} has a different tokenizer from {lm_a.name!r} "
            f"({len(lm_b.tokenizer)} vs {len(lm_a.tokenizer)} tokens); compare-models compares the two "
            "distributions token by token, so both models must share one tokenizer"
        ) from exc
    return lm_a, lm_b


def generate_with(
    lm: LoadedModel, prompt_ids: Tensor, cfg: SamplingConfig, preset: str, quiet: bool
) -> tuple[list[int], str, int]:
    """A's text through the usual loop: its token ids (the ending EOS too), why it stopped, and
    the exit code. Ctrl-C, SIGTERM or SIGHUP stop the generation: what A wrote until then is
    still scored, then the command exits 130 (143, 129)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from llmsample.engine.loop import generate
    from llmsample.events import RunStats, Summary
    from llmsample.terminal import stderr_console

    stats = RunStats(model=lm.name, preset=preset, seed=cfg.seed, prompt_tokens=prompt_ids.shape[1])
    ids: list[int] = []
    stop_reason = "length"
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    code = 0
    with Progress(*columns, console=stderr_console(), transient=True, disable=quiet) as progress:
        task = progress.add_task(f"generating with {lm.name}", total=cfg.max_tokens)
        try:
            for item in generate(lm, prompt_ids, cfg, stats, top_n=0):
                if isinstance(item, Summary):
                    stop_reason = item.stop_reason
                else:
                    ids.append(item.token_id)
                    progress.advance(task)
        except (KeyboardInterrupt, Interrupted) as exc:
            ignore_further_interrupts()
            code = exc.exit_code if isinstance(exc, Interrupted) else 130
            stop_reason = "interrupted"
    return ids, stop_reason, code


def show(tokens: list[Any], summary: Any, options: dict[str, Any]) -> None:
    from llmsample.render.drift_view import drift_legend, drift_page, drift_report
    from llmsample.terminal import stderr_console, stdout_console, use_color

    if options["fmt"] == "jsonl":
        from llmsample.render.jsonout import strict_json

        for token in tokens:
            click.echo(strict_json(token.to_dict()))
        click.echo(strict_json(summary.to_dict()))
    else:
        color = use_color(options["no_color"])
        console = stdout_console(color)
        if color and not options["quiet"]:
            stderr_console().print(drift_legend())
        console.print(drift_report(tokens, summary))  # the table's marks carry the bands without colour
    if options["html"]:
        from llmsample.render.html import write_page

        write_page(options["html"], drift_page(tokens, summary))
