"""``llmsample generate``: stream a model's answer, sampled by our own loop."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.host_options import with_engine_options
from llmsample.commands.model_options import load_model_with_progress
from llmsample.commands.options import end_rank, generation_options, read_prompt, reference_option
from llmsample.commands.sampling_options import resolve_sampling, resolve_watch
from llmsample.errors import Interrupted, RuntimeFailure, UserError, ignore_further_interrupts, signals_deferred

if TYPE_CHECKING:
    from llmsample.client.connection import Target
    from llmsample.engine.speculative import Drafter
    from llmsample.events import RunStats, Summary
    from llmsample.models.loading import LoadedModel
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
    from llmsample.client.route import choose

    if options.get("replay") is not None:
        from llmsample.commands.generate_replay import replay_options

        options, asked, check = replay_options(options)
        run(options, asked, check)
        return
    target = choose(options)  # before anything imports torch: the warm path stays light
    if target is not None:
        generate_on(target, options)
        return
    run(options)


def run(
    options: dict[str, Any], asked: tuple[str, SamplingConfig, str] | None = None, check: Renderer | None = None
) -> None:
    """Shared by ``generate`` and ``speculate``: the same renderers over the same events.
    ``asked``: the preset, settings and prompt of a logged run (``--replay``), ``check`` its renderer."""
    from llmsample.engine.prompt import encode_prompt
    from llmsample.events import RunStats

    preset, cfg, prompt = asked or what_was_asked(options)
    if options.get("tp"):
        options = join_tensor_parallel(options)
    lm = load_model_with_progress(options)
    watch = resolve_watch(options, lm)
    prompt_ids = encode_prompt(lm, prompt, options["system"], options["raw"], options["truncate"], cfg.max_tokens)
    stats = RunStats(model=lm.name, preset=preset, seed=cfg.seed)
    if lm.quantization:
        stats.note(quantization=lm.quantization)
    if lm.placed_on:
        stats.note(device_map=tuple(lm.placed_on))
    reference = load_reference(options, lm) if options.get("reference") else None
    if options.get("draft"):
        from llmsample.engine.loop import speculative_generate

        drafter = build_drafter(options, lm)()  # a bad draft fails before any output
        events = speculative_generate(
            lm, prompt_ids, cfg, stats, drafter,
            draft_tokens=options.get("draft_tokens"), top_n=options["top_n"], ignore_eos=options["ignore_eos"],
            watch=watch, reference=reference,
        )  # fmt: skip
        if options.get("compare"):
            events = with_plain_comparison(events, lm, prompt_ids, cfg, options)
    else:
        from llmsample.engine.loop import generate as generate_events

        events = generate_events(
            lm, prompt_ids, cfg, stats, top_n=options["top_n"], ignore_eos=options["ignore_eos"], watch=watch,
            reference=reference,
        )  # fmt: skip
    renderers = build_renderers(options, asked=(prompt, cfg.as_dict())) if not options.get("silent") else []
    summary = consume(events, [*renderers, *([check] if check else [])], stats, options["quiet"])
    if options.get("tp"):
        end_rank(0)
    from llmsample.sampling.constraint import incomplete_message

    incomplete = incomplete_message(summary)
    if incomplete is not None:  # the text as far as it got is out; a script must not parse it
        raise RuntimeFailure(incomplete)


def what_was_asked(options: dict[str, Any]) -> tuple[str, SamplingConfig, str]:
    """The preset, the settings and the prompt, resolved alike in-process and for an engine; a
    fresh seed drawn here, reported in the summary so the run can be repeated."""
    from llmsample.sampling.config import fresh_seed

    preset, cfg = resolve_sampling(options)
    if cfg.seed is None:
        cfg = dataclasses.replace(cfg, seed=fresh_seed())
    return preset, cfg, read_prompt(options["prompt"], options["raw"])


def generate_on(target: Target, options: dict[str, Any]) -> None:
    """``generate`` on an engine: the settings resolved here as in-process (the seed drawn here,
    a constraint compiled here), the prompt sent as text (the engine applies the chat template),
    the records rendered here; ``--draft ngram`` drafts on the engine."""
    from llmsample.client.connection import say, stream_job
    from llmsample.client.wire import Job
    from llmsample.events import RunStats
    from llmsample.sampling.constraint import incomplete_message

    preset, cfg, prompt = what_was_asked(options)
    ngram = None
    if options.get("draft") == "ngram":
        ngram = (options["ngram_min"], options["ngram_max"])
        if ngram[0] > ngram[1]:
            raise UserError(f"--ngram-min {ngram[0]} is above --ngram-max {ngram[1]}")
    job = Job(prompt, cfg, preset, options["system"], options["raw"], options["truncate"], options["top_n"],
              model=None if target.where.startswith("unix:") else options["model"], ngram=ngram,
              draft_tokens=options.get("draft_tokens") if ngram else None, cache_prompt=False)  # fmt: skip
    stats = RunStats(model=target.name or options["model"] or "", preset=preset, seed=cfg.seed)
    events = stream_job(target, job, say)
    if ngram and options.get("compare"):
        events = with_comparison_on(target, job, events)
    try:
        renderers = build_renderers(options, asked=(prompt, cfg.as_dict())) if not options.get("silent") else []
        summary = consume(events, renderers, stats, options["quiet"])
    finally:
        events.close()  # a Ctrl-C: the connection closes, and the engine cancels the row
    if summary.stop_reason == "cancelled":
        raise RuntimeFailure(f"the engine at {target.where} stopped before the answer was done")
    incomplete = incomplete_message(summary)
    if incomplete is not None:
        raise RuntimeFailure(incomplete)


def with_comparison_on(target: Target, job: Any, events: Iterator[Any]) -> Iterator[Any]:
    """``--compare`` on an engine: after the speculative job, the same job without a drafter;
    the summary gains the plain speed and the speedup, as :func:`with_plain_comparison`'s does."""
    from llmsample.client.connection import say, stream_job
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
    plain = [record for record in stream_job(target, dataclasses.replace(job, ngram=None), say)][-1]
    speedup = summary.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s and summary.tokens_per_s else None
    comparison = PlainComparison(plain.tokens_per_s, plain.elapsed_s, speedup)
    yield dataclasses.replace(summary, facts=dataclasses.replace(summary.facts, comparison=comparison))


def join_tensor_parallel(options: dict[str, Any]) -> dict[str, Any]:
    """``--tp`` under torchrun: join the process group; every rank runs the loop on its slice of
    the model and feeds rank 0's tokens, and only rank 0 prints."""
    import os

    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", 1)) < 2:
        raise UserError(
            "--tp splits the model over the processes of a torchrun launch: "
            "torchrun --nproc-per-node N -m llmsample generate --tp ..."
        )
    for flag, given in (("--draft", options.get("draft")), ("--compile", options["compile_model"])):
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


def load_reference(options: dict[str, Any], lm: LoadedModel) -> LoadedModel:
    """``--reference``: the same checkpoint in float32, unquantized, placed like the model (on
    llama.cpp: the same GGUF dequantized on transformers, which measures the quantized kernels)."""
    from llmsample.commands.model_options import placement_from_options
    from llmsample.models.loading import load_model

    if lm.quantization and not options.get("quantize") and lm.backend != "llama.cpp":
        raise UserError(
            f"--reference needs full-precision weights, and model {lm.name!r} is stored quantized "
            f"({lm.quantization}); compare against the checkpoint it was quantized from"
        )
    placement = placement_from_options(options)
    device = "auto" if placement is not None else str(lm.device)
    return load_model(options["model"], device, "float32", placement=placement)


def build_drafter(options: dict[str, Any], lm: LoadedModel) -> Callable[[], Drafter]:
    """``--draft ngram`` (prompt lookup), ``--draft suffix`` (a pool across requests) or a model sharing the target's tokenizer, loaded once:
    a maker of one drafter per row (a draft model's drafter keeps that row's draft cache)."""
    from llmsample.engine.speculative import ModelDrafter, NgramDrafter, check_same_tokenizer
    from llmsample.models.loading import load_model

    vocab = lm.model.config.vocab_size
    if options["draft"] in ("ngram", "suffix"):
        if options["ngram_min"] > options["ngram_max"]:
            raise UserError(f"--ngram-min {options['ngram_min']} is above --ngram-max {options['ngram_max']}")

        def ngram() -> NgramDrafter:  # a row's own: it indexes that row's tokens
            return NgramDrafter(vocab, lm.sample_device, options["ngram_min"], options["ngram_max"])

        if options["draft"] == "suffix":  # one pool for the run (a server's: every request's)
            from llmsample.engine.suffix_pool import SuffixDrafter, SuffixPool

            pool = SuffixPool(options["ngram_min"], max(options["ngram_max"], 6))
            return lambda: SuffixDrafter(pool, ngram())
        return ngram
    from llmsample.models.llamacpp_load import gguf_file

    if gguf_file(options["draft"]) is not None and lm.sample_device.type == "cpu":
        draft = load_model(options["draft"], "cpu", backend="auto")  # llama.cpp where it is installed
    else:  # on the device the target samples on (its input device when it is placed over several)
        backend = "auto" if lm.backend == "torch" else "transformers"  # a torch target's draft on torch where it can
        draft = load_model(options["draft"], str(lm.sample_device), str(lm.dtype).removeprefix("torch."), backend=backend)
    check_same_tokenizer(draft, lm)
    return lambda: ModelDrafter(draft, vocab, lm.sample_device)


def with_plain_comparison(
    events: Iterator[Any], lm: LoadedModel, prompt_ids: Any, cfg: SamplingConfig, options: dict[str, Any]
) -> Iterator[Any]:
    """``--compare``: after the speculative run (its runner given back), the same prompt decoded
    without speculation, same seed; the summary gains the plain speed and the speedup."""
    from llmsample.engine.loop import generate as generate_events
    from llmsample.engine.loop import run_to_end
    from llmsample.events import PlainComparison, RunStats, Summary

    summary = None
    for item in events:
        if isinstance(item, Summary):
            summary = item
        else:
            yield item
    assert summary is not None
    plain_stats = RunStats(model=summary.model, preset=summary.preset, seed=summary.seed)
    _, plain = run_to_end(
        generate_events(lm, prompt_ids, cfg, plain_stats, top_n=options["top_n"], ignore_eos=options["ignore_eos"])
    )
    speedup = summary.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s and summary.tokens_per_s else None
    comparison = PlainComparison(plain.tokens_per_s, plain.elapsed_s, speedup)
    yield dataclasses.replace(summary, facts=dataclasses.replace(summary.facts, comparison=comparison))


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
    from llmsample.events import Summary
    from llmsample.render.stream import print_summary
    from llmsample.terminal import stderr_console

    code = 0
    summary = None
    shown: list[str] = []  # what reached the renderers: a signal can land between a token's count and its print
    try:
        for item in events:
            if isinstance(item, Summary):
                summary = item
            else:
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
        print_summary(stderr_console(), summary)
    if code:
        raise click.exceptions.Exit(code)
    return summary
