"""Options the commands share (prompt, output, speculation, logging), and reading the prompt;
the model's are in :mod:`llmsample.commands.model_options`, the sampler's in
:mod:`llmsample.commands.sampling_options`."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from llmsample.commands.model_options import model_options, placement_options
from llmsample.commands.option_group import check_utf8_option, option_group
from llmsample.commands.sampling_options import constraint_options, sampling_options, watch_option
from llmsample.errors import UserError
from llmsample.jobs import NGRAM


def _check_html_path(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """Fail before the model loads, not after the text is generated: the page replaces the
    file by a rename (see ``write_page``), so it needs a file name in a directory we can write."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("is empty; give a file name, e.g. --html out.html")
    path = Path(value)
    if path.is_dir():
        raise click.BadParameter(f"{value} is a directory; give a file name, e.g. {path / 'out.html'}")
    if not path.parent.is_dir():
        raise click.BadParameter(f"the directory {path.parent} does not exist")
    try:
        with tempfile.TemporaryFile(dir=path.parent):  # the real test: root ignores permission bits
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write in {path.parent} ({exc.strerror}); choose another directory") from exc
    return path


html_option = click.option(
    "--html",
    metavar="FILE",
    callback=_check_html_path,
    help="Also write a self-contained HTML view to this file.",
)


format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "jsonl"]),
    default="text",
    show_default=True,
    help="text to read, or JSON lines for scripts: one record per line (docs/output.md).",
)


no_color_option = click.option("--no-color", is_flag=True, help="No colour (also: NO_COLOR=1).")


def quiet_option(silenced: str = "progress") -> Callable[[Any], Any]:
    """``--quiet``/``-q``; ``silenced`` says what each command keeps off stderr."""
    return click.option("--quiet", "-q", is_flag=True, help=f"No {silenced} on stderr.")


prompt_options = option_group(
    click.option(
        "--prompt",
        "-p",
        metavar="TEXT",
        callback=check_utf8_option,
        help="The prompt; '-' or omitted with piped stdin reads stdin.",
    ),
    click.option("--system", metavar="TEXT", callback=check_utf8_option, help="A system message (chat models)."),
    click.option(
        "--raw", is_flag=True, help="Send the prompt as plain text for completion, without the chat template."
    ),
    click.option(
        "--truncate",
        type=click.Choice(["error", "left"]),
        default="error",
        show_default=True,
        help="A prompt longer than the context: fail, or drop its oldest tokens.",
    ),
    panel="Prompt",
)


prompt_cache_option = click.option(
    "--prompt-cache-mb",
    type=click.IntRange(0),
    default=256,
    show_default=True,
    metavar="MB",
    help="Memory for the prompt cache across requests: a prompt that starts as an earlier or a running one did "
    "prefills only the rest (0: off).",
)


output_options = option_group(
    format_option,
    click.option("--top-n", type=click.IntRange(0, 100), default=5, show_default=True, help="Alternatives per token."),
    click.option(
        "--color-by",
        type=click.Choice(["sampled", "model"]),
        default="sampled",
        show_default=True,
        help="Colour by the probability in the sampling distribution, or under the raw model.",
    ),
    no_color_option,
    click.option("--inspect", is_flag=True, help="After the text, a table of every token's numbers."),
    html_option,
    quiet_option("legend, progress or summary"),
    click.option("--ignore-eos", is_flag=True, help="Keep going past end-of-sequence (benchmarks)."),
    watch_option,
    panel="Output",
)


reference_option = click.option(
    "--reference",
    is_flag=True,
    help="Also score every token under the same checkpoint in float32, unquantized: KL and same-top per token.",
)


draft_options = option_group(
    click.option(
        "--draft",
        metavar="auto|none|ngram|suffix|ID|DIR",
        help="Speculative decoding: 'auto' drafts from what earlier and running requests wrote and from the "
        "prompt, only where the target has been keeping such drafts (llama.cpp and --backend torch); 'none'; "
        "'ngram' (prompt lookup); 'suffix' (auto's drafts on every backend); or a draft model. "
        "[default: auto]",
    ),
    click.option("--draft-tokens", type=click.IntRange(1, 64), help="Fixed draft length K [default: adaptive]."),
    click.option(
        "--ngram-max", type=click.IntRange(1, 64), default=NGRAM[1], show_default=True, help="Longest n-gram to match."
    ),
    click.option(
        "--ngram-min",
        type=click.IntRange(1, 64),
        default=NGRAM[0],
        show_default=True,
        help="Shortest n-gram to match (1 guesses too often).",
    ),
    panel="Speculation",
)


log_option = option_group(
    click.option("--no-log", is_flag=True, help="Keep this run out of `llmsample logs` (also LLMSAMPLE_NO_LOG=1)."),
    panel="Output",
)


def deterministic_option(default: bool | None = False, when: str = "") -> Callable[[Any], Any]:
    """``--deterministic/--no-deterministic``; ``default`` None: the command decides (``when`` says how)."""
    shown = when or ("on" if default else "off")
    return click.option(
        "--deterministic/--no-deterministic",
        default=default,
        help="Batch-invariant numbers: every row runs alone, one position per pass, so a seed gives the same "
        f"text in every command, whatever runs beside it (slower; docs/determinism.md) [default: {shown}].",
    )


def keeps_log(options: dict[str, Any]) -> bool:
    """Whether this run goes to the run log: not with --no-log, LLMSAMPLE_NO_LOG or `llmsample logs off`."""
    from llmsample.logs.store import logging_on

    return not options.get("no_log") and logging_on()


compare_option = option_group(
    click.option("--compare", is_flag=True, help="Also decode without speculation (same seed) and report the speedup."),
    panel="Speculation",
)


def read_prompt(prompt: str | None, raw: bool = False) -> str:
    """``--prompt``, or stdin for ``-`` or when stdin is piped; stdin must be UTF-8. A chat
    prompt from stdin loses its trailing newline (``echo`` adds one, ``-p`` has none), so both
    ask the same question; ``--raw`` keeps stdin verbatim for completion."""
    if prompt is not None and prompt != "-":
        return prompt
    if sys.stdin is None:  # closed at start (<&-)
        raise UserError("no prompt: stdin is closed; pass --prompt TEXT, or pipe the prompt on stdin")
    if prompt is None and sys.stdin.isatty():
        raise UserError("no prompt: pass --prompt TEXT, or pipe the prompt on stdin")
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"stdin is not valid UTF-8 (byte {exc.start}); convert it, e.g. with iconv -t UTF-8") from exc
    return text if raw else text.rstrip("\r\n")


def generation_options(f: Any) -> Any:
    """Everything ``generate`` and ``speculate`` share."""
    return option_group(
        prompt_options, model_options, placement_options, sampling_options, constraint_options, output_options,
        draft_options, compare_option, log_option, deterministic_option(),
    )(f)  # fmt: skip


def end_rank(code: int) -> NoReturn:
    """The end of a rank of a torchrun launch, its output written and flushed. Now and then gloo's
    threads abort the process in the interpreter's teardown (std::terminate, SIGABRT), which
    would turn a finished run into a failed one for the launcher: leave without that teardown."""
    import os

    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
