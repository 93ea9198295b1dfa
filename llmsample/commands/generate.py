"""``llmsample generate``: stream a model's answer, sampled by our own loop."""

from __future__ import annotations

import dataclasses
import secrets
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.options import generation_options, load_model_with_progress, read_prompt, resolve_sampling
from llmsample.errors import Interrupted, ignore_further_interrupts

if TYPE_CHECKING:
    from llmsample.events import RunStats
    from llmsample.render.stream import Renderer


@click.command()
@generation_options
def generate(**options: Any) -> None:
    """Generate text from a prompt, token by token, with our own sampler.

    \b
    llmsample generate -p "What is the capital of France?"
    llmsample generate -p "Write a haiku" --preset creative --seed 7 --inspect
    echo "Once upon a time" | llmsample generate --raw --format jsonl
    """
    run(options)


def run(options: dict[str, Any]) -> None:
    """Shared by ``generate`` and ``speculate``: the same renderers over the same events."""
    from llmsample.engine.loop import encode_prompt
    from llmsample.events import RunStats

    preset, cfg = resolve_sampling(options)
    if cfg.seed is None:  # a fresh seed, reported in the summary so the run can be repeated
        cfg = dataclasses.replace(cfg, seed=secrets.randbits(63))
    prompt = read_prompt(options["prompt"], options["raw"])
    lm = load_model_with_progress(options)
    prompt_ids = encode_prompt(lm, prompt, options["system"], options["raw"], options["truncate"], cfg.max_tokens)
    stats = RunStats(model=lm.name, preset=preset, seed=cfg.seed)
    if options.get("draft"):
        from llmsample.engine.speculative import make_drafter, speculate_events

        drafter = make_drafter(options["draft"], lm, options)  # a bad draft fails before any output
        events = speculate_events(lm, prompt_ids, cfg, stats, drafter, options)
    else:
        from llmsample.engine.loop import generate as generate_events

        events = generate_events(lm, prompt_ids, cfg, stats, top_n=options["top_n"], ignore_eos=options["ignore_eos"])
    consume(events, build_renderers(options), stats, quiet=options["quiet"])


def build_renderers(options: dict[str, Any]) -> list[Renderer]:
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
        from llmsample.render.html import HtmlRenderer

        renderers.append(HtmlRenderer(options["html"], color_by=options["color_by"]))
    return renderers


def consume(events: Iterator[Any], renderers: list[Renderer], stats: RunStats, quiet: bool = False) -> None:
    """Feed events to the renderers; on Ctrl-C, SIGTERM or SIGHUP keep what was printed, finish
    with an 'interrupted' summary and exit 130 (143, 129)."""
    from llmsample.events import Summary
    from llmsample.render.stream import summary_line
    from llmsample.terminal import stderr_console

    code = 0
    summary = None
    try:
        for item in events:
            if isinstance(item, Summary):
                summary = item
            else:
                for renderer in renderers:
                    renderer.token(item)
    except (KeyboardInterrupt, Interrupted) as exc:
        ignore_further_interrupts()
        code = exc.exit_code if isinstance(exc, Interrupted) else 130
        summary = stats.summary("interrupted")
    assert summary is not None
    for renderer in renderers:
        renderer.summary(summary)
    sys.stdout.flush()
    if not quiet:
        stderr_console().print(f"[dim]{summary_line(summary)}[/]")
    if code:
        raise click.exceptions.Exit(code)
