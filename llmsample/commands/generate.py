"""``llmsample generate``: stream a model's answer, sampled by our own loop."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.options import end_rank, generation_options, read_prompt, reference_option
from llmsample.commands.sampling_options import resolve_sampling
from llmsample.errors import Interrupted, RuntimeFailure, UserError, ignore_further_interrupts, signals_deferred

if TYPE_CHECKING:
    from llmsample.client.engine_client import EngineClient
    from llmsample.events import RunStats, Summary
    from llmsample.jobs import Job
    from llmsample.render.stream import Renderer
    from llmsample.sampling.config import SamplingConfig


@click.command(cls=GroupedCommand)
@generation_options
@click.option(
    "--tp",
    is_flag=True,
    help="Tensor parallel: split the model over the processes of a torchrun launch (see docs/scaling.md).",
)
@reference_option
@click.option(
    "--replay",
    metavar="ID",
    type=int,
    help="Run a logged run again (its prompt, settings, seed, model) and say whether the tokens match.",
)
@with_engine_options
def generate(**options: Any) -> None:
    """Generate text from a prompt, token by token, with our own sampler.

    \b
    llmsample generate -p "What is the capital of France?"
    llmsample generate -p "Write a haiku" --preset creative --seed 7 --inspect
    echo "Once upon a time" | llmsample generate --raw --format jsonl
    llmsample generate -p "Explain top-p" --quantize int8 --reference --format jsonl
    llmsample generate --replay 12

    A warm engine of the same model (llmsample start) answers instead of loading the model here.
    """
    if options.get("replay") is not None:
        from llmsample.commands.generate_replay import replay_options

        options, asked, check = replay_options(options)
        run(options, asked, check)
        return
    run(options)


def run(
    options: dict[str, Any], asked: tuple[str, SamplingConfig, str] | None = None, check: Renderer | None = None
) -> None:
    """``generate`` and ``speculate``, one program on whichever engine runs it: the settings
    resolved here (the seed drawn here, a constraint compiled here) into a job, its records
    rendered here. ``asked``: the preset, settings and prompt of a logged run (``--replay``,
    always in this process), ``check`` its renderer."""
    from llmsample.commands.host_options import open_engine
    from llmsample.commands.model_options import local_engine
    from llmsample.events import RunStats
    from llmsample.sampling.constraint import incomplete_message

    preset, cfg, prompt = asked or what_was_asked(options)
    job = build_job(options, preset, cfg, prompt)
    engine = local_engine(options) if asked else open_engine(options)  # an engine refuses --tp
    if options.get("tp"):
        options = join_tensor_parallel(options)
        engine = local_engine(options)
    events = engine.run(job)  # a prompt or a draft that cannot run fails here, before any output
    if options.get("compare") and (job.ngram or job.drafter):
        events = with_plain_comparison(engine, job, events)
    try:
        renderers = build_renderers(options, asked=(prompt, cfg.as_dict())) if not options.get("silent") else []
        stats = RunStats(model=engine.model_name() or options["model"] or "", preset=preset, seed=cfg.seed)
        summary = consume(events, [*renderers, *([check] if check else [])], stats, options["quiet"])
    finally:
        events.close()  # a Ctrl-C: on an engine, the connection closes and the row is cancelled
    if options.get("tp"):
        end_rank(0)
    if summary.stop_reason == "cancelled":
        raise RuntimeFailure(f"the engine at {engine.where} stopped before the answer was done")
    incomplete = incomplete_message(summary)
    if incomplete is not None:  # the text as far as it got is out; a script must not parse it
        raise RuntimeFailure(incomplete)


def what_was_asked(options: dict[str, Any]) -> tuple[str, SamplingConfig, str]:
    """The preset, the settings and the prompt, resolved before any engine is asked; a fresh
    seed drawn here, reported in the summary so the run can be repeated."""
    from llmsample.sampling.config import fresh_seed

    preset, cfg = resolve_sampling(options)
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=fresh_seed())
    return preset, cfg, read_prompt(options["prompt"], options["raw"])


def build_job(options: dict[str, Any], preset: str, cfg: SamplingConfig, prompt: str) -> Job:
    """The command's job: ``--draft ngram`` drafts from the row's own tokens, a draft model or
    ``suffix`` is the engine's drafter; the prompt is prefilled whole (``cache_prompt``), so a
    warm engine's bytes are this process's."""
    from llmsample.jobs import Job, engine_drafter

    draft = options.get("draft")
    ngram = None
    if draft == "ngram":
        ngram = (options["ngram_min"], options["ngram_max"])
    if draft in (None, "auto", "ngram", "suffix") and options["ngram_min"] > options["ngram_max"]:
        raise UserError(f"--ngram-min {options['ngram_min']} is above --ngram-max {options['ngram_max']}")
    return Job(prompt, cfg, preset, options["system"], options["raw"], options["truncate"], options["top_n"],
               model=options["model"], ngram=ngram, draft_tokens=options.get("draft_tokens") if draft != "none" else None,
               cache_prompt=False, ignore_eos=options["ignore_eos"], watch=tuple(options.get("watch") or ()),
               reference=bool(options.get("reference")), drafter=engine_drafter(draft))  # fmt: skip


def with_plain_comparison(engine: EngineClient, job: Job, events: Iterator[Any]) -> Iterator[Any]:
    """``--compare``: after the speculative job, the same job without a drafter (same seed, on
    the same engine); the summary gains the plain speed and the speedup."""
    from llmsample.events import PlainComparison, Summary

    summary = None
    try:
        for item in events:
            if isinstance(item, Summary):
                summary = item
            else:
                yield item
    finally:
        events.close()
    assert summary is not None
    plain_job = dataclasses.replace(job, ngram=None, drafter=None, draft_tokens=None, watch=(), reference=False)
    plain = list(engine.run(plain_job))[-1]
    speedup = summary.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s and summary.tokens_per_s else None
    comparison = PlainComparison(plain.tokens_per_s, plain.elapsed_s, speedup)
    yield dataclasses.replace(summary, facts=dataclasses.replace(summary.facts, comparison=comparison))


def join_tensor_parallel(options: dict[str, Any]) -> dict[str, Any]:
    """``--tp`` under torchrun: join the process group; every rank runs the loop on its slice of
    the model and feeds rank 0's tokens, and only rank 0 prints."""
    import os

    import torch
    import torch.distributed as dist

    from llmsample.jobs import drafter_asked

    if int(os.environ.get("WORLD_SIZE", 1)) < 2:
        raise UserError(
            "--tp splits the model over the processes of a torchrun launch: "
            "torchrun --nproc-per-node N -m llmsample generate --tp ..."
        )
    for flag, given in (("--draft", drafter_asked(options.get("draft"))), ("--compile", options["compile_model"])):
        if given:
            raise UserError(f"--tp does not combine with {flag} yet; leave one of them out")
    cuda = torch.cuda.is_available() and options["device"] in ("auto", "cuda")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        options = {**options, "device": f"cuda:{local}"}
    if dist.get_rank() != 0:
        options = {**options, "quiet": True, "silent": True, "html": None}
    return options


def build_renderers(options: dict[str, Any], asked: tuple[str, dict[str, Any]] | None = None) -> list[Renderer]:
    """The views a run's events go to; ``asked`` (the prompt and settings) heads an ``--html`` page
    and goes to the run log with them."""
    from llmsample.render.stream import ColorRenderer, JsonlRenderer, PlainRenderer, legend
    from llmsample.terminal import stderr_console, stdout_console, use_color

    renderers: list[Renderer] = []
    color = use_color(options["no_color"])
    if options["fmt"] == "jsonl":
        renderers.append(JsonlRenderer())
    elif color:
        renderers.append(ColorRenderer(stdout_console(True), options["color_by"]))
        if not options["quiet"]:
            stderr_console().print(legend(options["color_by"]))
    else:
        renderers.append(PlainRenderer())
    if options["inspect"]:
        from llmsample.render.inspect import InspectRenderer

        # JSONL already carries these numbers on stdout; the table then goes to stderr.
        renderers.append(InspectRenderer(stderr_console() if options["fmt"] == "jsonl" else stdout_console(color)))
    if options["html"]:
        from llmsample.render.html import HtmlRenderer, PageHead

        head = PageHead(asked[0], asked[1], options.get("system")) if asked else None
        renderers.append(HtmlRenderer(options["html"], color_by=options["color_by"], head=head))
    if asked and not options.get("no_log", True):
        from llmsample.logs.store import logging_on

        if logging_on():
            from llmsample.commands.generate_replay import logged_flags
            from llmsample.logs.recorder import LogRecorder

            command = click.get_current_context().info_name or "generate"
            renderers.append(LogRecorder(command, *asked, options.get("system"), flags=logged_flags(options)))
    return renderers


def consume(events: Iterator[Any], renderers: list[Renderer], stats: RunStats, quiet: bool = False) -> Summary:
    """Feed events to the renderers; on Ctrl-C, SIGTERM or SIGHUP keep what was printed, finish
    with an 'interrupted' summary and exit 130 (143, 129). Returns the summary."""
    from llmsample.commands.clock import since_start
    from llmsample.events import Summary
    from llmsample.render.stream import print_summary
    from llmsample.terminal import stderr_console

    code = 0
    summary = None
    first_at = None  # when the first token reached the renderers
    shown: list[str] = []  # what reached the renderers: a signal can land between a token's count and its print
    try:
        for item in events:
            if isinstance(item, Summary):
                summary = item
            else:
                first_at = first_at or time.perf_counter()
                with signals_deferred():
                    for renderer in renderers:
                        renderer.token(item)
                    shown.append(item.text)
    except (KeyboardInterrupt, Interrupted) as exc:
        ignore_further_interrupts()
        code = exc.exit_code if isinstance(exc, Interrupted) else 130
        summary = dataclasses.replace(stats.summary("interrupted"), tokens=len(shown), text="".join(shown))
    assert summary is not None
    for renderer in renderers:
        renderer.summary(summary)
    sys.stdout.flush()
    if not quiet:
        print_summary(stderr_console(), summary, since_start(first_at) if first_at else None)
    if code:
        raise click.exceptions.Exit(code)
    return summary
