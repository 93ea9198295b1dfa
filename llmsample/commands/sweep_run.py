"""``sweep``'s run once its lines are planned: the engine (here or warm, as ``batch`` finds it),
the output claimed and resumed, the lines decoded with a progress bar, then each setting's
figures on stdout and the plot and page written whole."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from llmsample.errors import RuntimeFailure, UserError


def run(options: dict[str, Any], settings: Sequence[Any], prompts: Sequence[Any], planned: Sequence[Any],
        base: dict[str, Any]) -> None:  # fmt: skip
    from llmsample.batch.output import claim_output, consolidate
    from llmsample.batch.settings import BatchSettings
    from llmsample.commands.batch import record_writer, refused_flags
    from llmsample.commands.host_options import open_engine
    from llmsample.render.progress import TokenProgress
    from llmsample.sweep.metrics import detector
    from llmsample.sweep.samples import Annotator, parsed_lines, prompts_language, run_sweep
    from llmsample.terminal import stderr_console

    y_axis = _checked(options, prompts)
    detect = detector(options["language"])  # a bad --language is one line before the output is touched
    language = options["language"] or prompts_language(prompts, detect)
    engine = open_engine(options, refused_flags(options))
    judge = _judge(options, engine)
    batch_settings = BatchSettings(top_n=options["top_n"], batch_size=options["batch_size"], tokens="full")
    claim = claim_output(options["output"]) if options["output"] else None
    regular = claim is not None and claim.regular
    kept: list[dict[str, Any]] = []  # the records, where no file keeps them
    try:
        lines = parsed_lines(planned)
        settled = consolidate(claim.path, lines, "jsonl", keep_errors=False) if regular else None
        console = stderr_console()
        disabled = options["quiet"] or not console.is_terminal
        annotate = Annotator(planned, base, detect, language, judge)
        with record_writer(claim.path if claim else None, stdout=False) as write, \
                TokenProgress(console, "samples", disabled) as progress:  # fmt: skip

            def keep(record: dict[str, Any]) -> None:
                write(record)
                if not regular:
                    kept.append(record)

            done = settled.done if settled is not None else frozenset()
            outcome = run_sweep(engine, planned, done, batch_settings, keep, annotate, progress)
        if settled is not None and not settled.in_order_after(lines):
            consolidate(claim.path, lines, "jsonl", keep_errors=True)  # as batch -o puts it back
    finally:
        if claim is not None:
            claim.release()
    records = _all_records(claim.path, planned) if regular else kept
    _report(options, settings, records, y_axis, engine.model_name() or "")
    if outcome.failed:
        raise click.exceptions.Exit(1)


def _checked(options: dict[str, Any], prompts: Sequence[Any]) -> str:
    """What can be refused before the model loads, in one line; the quality axis. ``--plot
    FILE.html`` is the page (``--html``)."""
    if options["plot"] is not None and options["plot"].suffix.lower() == ".html":
        if options["html_path"] is not None:
            raise UserError("--plot FILE.html writes the page, and --html names one too: give one of them")
        options["html_path"], options["plot"] = options["plot"], None
    _check_studio(options)
    y_axis = options["y_axis"] or ("judge_logprob" if options["judge"] else "logprob")
    for flag, axis in (("--x", options["x_axis"]), ("--y", y_axis)):
        if axis == "judge_logprob" and not options["judge"]:
            raise UserError(f"{flag} judge_logprob needs --judge MODEL")
    if options["x_axis"] == y_axis:
        raise UserError(f"--x and --y are both {y_axis}; plot two figures against each other")
    if options["judge"] and any("messages" in prompt for prompt in prompts):
        raise UserError("--judge scores texts after a plain prompt; the prompts file has conversations (messages)")
    if options["plot"] is not None:
        from llmsample.sweep.plot import plot_format

        plot_format(options["plot"])
    for flag, path in (("--plot", options["plot"]), ("--html", options["html_path"])):
        if path is not None and not path.resolve().parent.is_dir():
            raise UserError(f"{flag} {path}: no such folder")
    return y_axis


def _check_studio(options: dict[str, Any]) -> None:
    """The studio extra's libraries, before the model loads: one line naming what to install."""
    import importlib.util

    wanted = ["py3langid", "sacrebleu"] + ["matplotlib"] * bool(options["plot"] or options["html_path"])
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"sweep needs {', '.join(missing)}: pip install 'llmsample[studio]'")


def _judge(options: dict[str, Any], engine: Any) -> Any:
    """The judge's engine: the sweep's own for the same model, else found as any command finds
    one (a warm engine of it, else loaded here)."""
    if not options["judge"]:
        return None
    if options["judge"] == options["model"]:
        return engine
    from llmsample.commands.host_options import open_engine

    return open_engine({**options, "model": options["judge"], "host": None})


def _all_records(path: Path, planned: Sequence[Any]) -> list[dict[str, Any]]:
    """The sweep's records in the output (a resumed run's included), this plan's only, read as
    ``batch -o`` reads its file."""
    from llmsample.batch.resume import read_records

    wanted = {p.line["custom_id"] for p in planned}
    return [record for _, record, _ in read_records(path, "jsonl").lines if record.get("custom_id") in wanted]


def _report(options: dict[str, Any], settings: Sequence[Any], records: list[dict[str, Any]], y: str, model: str) -> None:
    from llmsample.batch.result_lines import dumps
    from llmsample.sweep.summary import summarize

    x = options["x_axis"]
    summaries = summarize(settings, records, x, y)
    title = f"{model} · {options['seeds']} seeds · {len({r['prompt_index'] for r in records})} prompts"
    if options["fmt"] == "jsonl":
        for summary in summaries:
            click.echo(dumps(summary.to_dict()))
    else:
        _table(summaries, x, y, options["quiet"])
    if options["plot"] is not None:
        from llmsample.sweep.plot import write_plot

        write_plot(options["plot"], summaries, x, y, title)
    if options["html_path"] is not None:
        from llmsample.files import replace_whole
        from llmsample.sweep.study_page import sweep_page

        try:
            replace_whole(options["html_path"], sweep_page(summaries, records, x, y, title).encode("utf-8"))
        except OSError as exc:
            raise RuntimeFailure(f"cannot write --html {options['html_path']} ({exc.strerror or exc})") from exc


def _table(summaries: Sequence[Any], x: str, y: str, quiet: bool) -> None:
    """A plain table (piped output stays plain): a star marks the Pareto front."""
    keys = [y, x, *(k for k in ("entropy", "repeats", "loops", "early_end", "off_language") if k not in (x, y))]
    rows = [["setting", "n", *keys]]
    for summary in summaries:
        cells = [summary.setting.name + (" *" if summary.front else ""), str(summary.samples)]
        cells += ["-" if summary.metrics.get(k) is None else f"{summary.metrics[k].mean:.3f}" for k in keys]
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if not quiet:
        click.echo("* on the Pareto front of the two first figures' means", err=True)
