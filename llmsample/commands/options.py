"""Options shared by the commands, and turning them into a model, a prompt and a config."""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from llmsample.errors import UserError
from llmsample.sampling import presets as preset_store
from llmsample.sampling.config import ConfigError, SamplingConfig

if TYPE_CHECKING:
    from llmsample.models.loading import LoadedModel
    from llmsample.sampling.constraint import Constraint

# The config's keys that repeat on the command line, each a flag in the singular (or as it is).
REPEATED_FLAGS = {
    "stop": "stop",
    "dry_sequence_breakers": "dry_sequence_breaker",
    "logit_bias": "logit_bias",
    "ban": "ban",
}
# The config's keys that are plain flags: ``description`` is not a flag, the repeated ones are apart.
SAMPLING_KEYS = tuple(key for key in SamplingConfig.keys() if key != "description" and key not in REPEATED_FLAGS)  # noqa: SIM118
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def _check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not DEVICE_PATTERN.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return value


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
format_option = click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text", show_default=True)
no_color_option = click.option("--no-color", is_flag=True, help="No colour (also: NO_COLOR=1).")


def quiet_option(silenced: str = "progress") -> Callable[[Any], Any]:
    """``--quiet``/``-q``; ``silenced`` says what each command keeps off stderr."""
    return click.option("--quiet", "-q", is_flag=True, help=f"No {silenced} on stderr.")


def check_utf8(text: str, source: str) -> str:
    """Bytes that are not UTF-8 reach Python as lone surrogates (argv) and fail deep in the
    tokenizer, after the model load; the same one line as for invalid stdin, up front."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = len(text[: exc.start].encode("utf-8"))
        raise UserError(f"{source} is not valid UTF-8 (byte {byte}); convert it, e.g. with iconv -t UTF-8") from exc
    return text


def check_utf8_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Click callback for text options (one value or a tuple of them)."""
    for text in value if isinstance(value, tuple) else [value]:
        if text is not None:
            check_utf8(text, param.opts[0])
    return value


def _parse_logit_bias(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[tuple[str, float], ...]:
    """``TOKEN=BIAS``: TOKEN an id or a text (split at the last ``=``, so a text may hold one)."""
    check_utf8_option(ctx, param, value)
    pairs = []
    for item in value:
        token, sep, bias = item.rpartition("=")
        try:
            number = float(bias)
        except ValueError:
            number = None
        if not sep or not token or number is None:
            raise click.BadParameter(
                f"{item!r} is not TOKEN=BIAS; e.g. --logit-bias 504=-100 or --logit-bias ' Paris=5'"
            )
        pairs.append((token, number))
    return tuple(pairs)


def option_group(*decorators: Callable[[Any], Any], panel: str | None = None) -> Callable[[Any], Any]:
    """Several options as one decorator; ``panel``: the heading they are listed under in ``--help``
    (rich-click reads an option's ``panel``)."""

    def apply(f: Any) -> Any:
        before = len(getattr(f, "__click_params__", []))
        for decorator in reversed(decorators):
            f = decorator(f)
        if panel is not None:
            for param in f.__click_params__[before:]:
                param.panel = getattr(param, "panel", None) or panel
        return f

    return apply


model_options = option_group(
    click.option("--model", "-m", metavar="ID|DIR", help="Hub id or local directory [default: SmolLM2-135M-Instruct]."),
    click.option(
        "--device", default="auto", show_default=True, callback=_check_device, help="auto, cpu, cuda, cuda:N or mps."
    ),
    click.option(
        "--dtype",
        type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
        default="auto",
        show_default=True,
        help="auto: the checkpoint's dtype where the device runs it natively (bf16 on CUDA, on CPUs with AVX512-BF16/AMX), else float32 (see docs/models.md).",
    ),
    click.option(
        "--compile",
        "compile_model",
        is_flag=True,
        help="Static KV cache + torch.compile'd decode step: faster tokens after a slow first start (cached on disk).",
    ),
    click.option(
        "--backend",
        type=click.Choice(["auto", "transformers", "llama.cpp", "torch"]),
        default="auto",
        show_default=True,
        envvar="LLMSAMPLE_BACKEND",
        help="llama.cpp runs GGUF files, local checkpoints (written to GGUF once) and the default model on the CPU; needs llmsample[llamacpp]. torch: llmsample's own forward of Llama, Mistral and Qwen2 checkpoints (no transformers import: the fastest start). auto: llama.cpp on a CPU where it can run the model and no transformers-only option is given, else torch where it can, else transformers [env: LLMSAMPLE_BACKEND].",
    ),
    click.option(
        "--gguf-type",
        metavar="TYPE",
        default=None,
        help="llama.cpp's weight type (F16, BF16, Q8_0, Q4_K_M...): the model written at it once by llama.cpp's quantizer. Default: a checkpoint's own precision, F16 for the default model.",
    ),
    panel="Model",
)


def _placement_value(parser: str) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A click callback that reads the option with ``llmsample.models.placement.<parser>`` (imported
    only when the option is given): absent stays None, a ValueError is a usage error."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        from llmsample.models import placement

        try:
            return getattr(placement, parser)(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from exc

    return check


placement_options = option_group(
    click.option(
        "--device-map",
        metavar="auto|balanced|sequential|FILE",
        callback=_placement_value("read_device_map"),
        help="Spread the layers over the GPUs, the CPU and disk (accelerate); FILE: a JSON {module: device} map.",
    ),
    click.option(
        "--max-memory",
        metavar="DEV=SIZE,...",
        callback=_placement_value("parse_max_memory"),
        help="Memory per device for --device-map, e.g. 0=20GiB,1=20GiB,cpu=60GiB (implies --device-map auto).",
    ),
    click.option(
        "--offload-folder",
        type=click.Path(file_okay=False, path_type=Path),
        callback=lambda ctx, param, value: None if value is None else check_offload_folder(value),
        help="Where layers offloaded to disk keep their weights (implies --device-map auto).",
    ),
    click.option(
        "--quantize",
        type=click.Choice(["int8", "int4"]),
        help="Quantize the weights as they load: int8 (torchao), int4 (bitsandbytes NF4); needs llmsample[quant].",
    ),
    panel="Devices and memory",
)


def check_offload_folder(folder: Path) -> Path:
    """A folder that cannot be written fails deep in the load with an error about the model: try
    it first (a file in it, or a directory beside where it would be made; nothing is left), as
    ``--html`` does, since root ignores permission bits and a read-only mount does not."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if existing == folder:
            with tempfile.TemporaryFile(dir=folder):
                pass
        elif not existing.is_dir():
            raise click.BadParameter(f"cannot make {folder}: {existing} is not a directory; choose another folder")
        else:
            Path(tempfile.mkdtemp(dir=existing)).rmdir()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write the offload folder {folder} ({exc.strerror or exc}); choose another folder"
        ) from exc
    return folder


def placement_from_options(options: dict[str, Any]) -> Any:
    """``--device-map`` and friends as a ``Placement``; None places nothing (one device)."""
    from llmsample.models.placement import Placement

    device_map, max_memory, folder = (options.get(k) for k in ("device_map", "max_memory", "offload_folder"))
    if device_map is None and max_memory is None and folder is None:
        return None
    return Placement(device_map or "auto", max_memory, None if folder is None else str(folder))


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

sampling_options = option_group(
    click.option("--preset", metavar="NAME", help="A preset from `llmsample presets list` [default: balanced]."),
    click.option("--preset-file", type=click.Path(path_type=Path, dir_okay=False), help="A preset TOML file."),
    click.option("--temperature", "-t", type=float, help="0 (or <= 1e-4) is greedy."),
    click.option("--top-k", type=int, help="Keep the k most likely tokens; 0 is off."),
    click.option("--top-p", type=float, help="Keep the smallest set reaching this mass; 1 is off."),
    click.option("--min-p", type=float, help="Drop tokens below min_p x the top probability; 0 is off."),
    click.option("--frequency-penalty", type=float, help="OpenAI's, in [-2, 2]."),
    click.option("--presence-penalty", type=float, help="OpenAI's, in [-2, 2]."),
    click.option("--repetition-penalty", type=float, help="CTRL's, > 0; 1 is off."),
    click.option("--max-tokens", "-n", type=int, help="Most tokens to generate."),
    click.option(
        "--stop", multiple=True, metavar="TEXT", callback=check_utf8_option, help="Stop before this text (repeatable)."
    ),
    click.option("--seed", type=int, help="Seed for the draws: same seed, same text."),
    click.option(
        "--typical-p", type=float, help="Locally typical sampling: keep this mass nearest the entropy; 1 is off."
    ),
    click.option(
        "--top-n-sigma", type=float, help="Keep logits within n standard deviations of the top one; 0 is off."
    ),
    click.option(
        "--xtc-threshold", type=float, help="XTC: tokens at least this likely are top choices [default: 0.1]."
    ),
    click.option(
        "--xtc-probability", type=float, help="XTC: how often top choices but the least are excluded; 0 is off."
    ),
    click.option("--dry-multiplier", type=float, help="DRY repetition penalty strength; 0 is off."),
    click.option("--dry-base", type=float, help="DRY: growth per repeated token [default: 1.75]."),
    click.option("--dry-allowed-length", type=int, help="DRY: repeats up to this long are free [default: 2]."),
    click.option("--dry-penalty-last-n", type=int, help="DRY: look at the last N tokens; 0: all [default: 0]."),
    click.option(
        "--dry-sequence-breaker",
        multiple=True,
        metavar="TEXT",
        callback=check_utf8_option,
        help='DRY: a token holding this text ends a repeat (repeatable; replaces \\n : " *).',
    ),
    click.option(
        "--logit-bias",
        multiple=True,
        metavar="TOKEN=BIAS",
        callback=_parse_logit_bias,
        help="Add BIAS in [-100, 100] to a token: an id or a one-token text (repeatable).",
    ),
    click.option(
        "--ban",
        multiple=True,
        metavar="TEXT",
        callback=check_utf8_option,
        help="Never generate this text (repeatable).",
    ),
    click.option("--min-tokens", type=int, help="No end-of-sequence or stop string before this many tokens."),
    click.option("--no-repeat-ngram-size", type=int, help="Never repeat an n-gram of this many tokens; 0 is off."),
    click.option(
        "--dynatemp-range", type=float, help="Dynamic temperature: t ± this, hotter when unsure; 0 is off."
    ),
    click.option(
        "--dynatemp-exponent",
        "--dynatemp-exp",
        "dynatemp_exponent",
        type=float,
        help="Dynamic temperature: exponent of the entropy [default: 1].",
    ),
    click.option("--smoothing-factor", type=float, help="Quadratic smoothing of the logits; 0 is off."),
    click.option("--smoothing-curve", type=float, help="Smoothing: 1 quadratic, up to 3 cubic [default: 1]."),
    click.option("--epsilon-cutoff", type=float, help="Drop tokens below this probability; 0 is off."),
    click.option("--eta-cutoff", type=float, help="Eta sampling: an entropy-scaled epsilon; 0 is off."),
    click.option("--top-h", type=float, help="Top-h: keep tokens until their entropy reaches h x the total; 0 is off."),
    click.option("--top-a", type=float, help="Drop tokens below a x the top probability squared; 0 is off."),
    click.option(
        "--p-less/--no-p-less", default=None, help="p-less: keep tokens at least as likely as two draws agree."
    ),
    click.option(
        "--mirostat", type=click.IntRange(0, 2), help="Mirostat 1 or 2: aim at a surprise of tau bits; replaces top-k etc."
    ),
    click.option("--mirostat-tau", type=float, help="Mirostat: the target surprise in bits [default: 5]."),
    click.option("--mirostat-eta", type=float, help="Mirostat: the learning rate of mu [default: 0.1]."),
    click.option(
        "--adaptive-target", type=float, help="Adaptive-p: favour tokens near this probability; negative is off."
    ),
    click.option("--adaptive-decay", type=float, help="Adaptive-p: decay of the running average [default: 0.9]."),
    click.option(
        "--samplers",
        metavar="A,B,...",
        help="The order of the stages after the history ones (top_k,min_p,temperature,...); only these run.",
    ),
    click.option(
        "--reasoning-budget",
        type=int,
        metavar="N",
        help="After N tokens in a <think> block, close it (its closing tokens forced, source 'forced').",
    ),
    panel="Sampling",
)

constraint_options = option_group(
    click.option("--json", "json", is_flag=True, help="Constrain the output to one JSON object."),
    click.option(
        "--json-schema",
        metavar="FILE|JSON",
        callback=check_utf8_option,
        help="Constrain the output to JSON valid under this schema (a file, or the schema itself).",
    ),
    click.option(
        "--regex", metavar="PATTERN", callback=check_utf8_option, help="Constrain the whole output to match PATTERN."
    ),
    click.option(
        "--choice",
        multiple=True,
        metavar="TEXT",
        callback=check_utf8_option,
        help="Constrain the output to exactly one of these texts (repeatable).",
    ),
    click.option(
        "--grammar",
        metavar="FILE",
        help="Constrain the output to a Lark grammar (llguidance's dialect); a .gbnf file is read as GBNF.",
    ),
    click.option(
        "--strict-schema",
        is_flag=True,
        help="Refuse a JSON schema with keywords llguidance cannot enforce [default: leave them unenforced, warned].",
    ),
    panel="Constrained output",
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
watch_option = click.option(
    "--watch",
    multiple=True,
    metavar="TOKEN",
    callback=check_utf8_option,
    help="Report this token's probability and rank at every step: an id or a one-token text (repeatable).",
)


def resolve_watch(options: dict[str, Any], lm: LoadedModel) -> tuple[tuple[str, int], ...]:
    """``--watch`` as ``(text as given, token id)`` pairs, resolved as ``--logit-bias`` resolves
    its tokens (an id in digits, or a text that encodes to exactly one token)."""
    from llmsample.sampling.vocabulary import Vocabulary, named_tokens

    given = options.get("watch") or ()
    if not given:
        return ()
    return named_tokens(Vocabulary.of(lm.tokenizer, lm.model.config.vocab_size, lm.eos_ids), given, "--watch")


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
        metavar="ID|DIR|ngram|suffix",
        help="Speculative decoding with this draft model, 'ngram' (prompt lookup) or 'suffix' (what earlier and "
        "running requests wrote, and prompt lookup).",
    ),
    click.option("--draft-tokens", type=click.IntRange(1, 64), help="Fixed draft length K [default: adaptive]."),
    click.option(
        "--ngram-max", type=click.IntRange(1, 64), default=4, show_default=True, help="Longest n-gram to match."
    ),
    click.option(
        "--ngram-min",
        type=click.IntRange(1, 64),
        default=2,
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


def sampling_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """Every sampling flag by config key, None where not given; a repeated flag (``--stop``,
    ``--ban``, ``--logit-bias``, ``--dry-sequence-breaker``) given replaces the preset's list."""
    overrides = {key: options.get(key) for key in SAMPLING_KEYS}
    for key, flag in REPEATED_FLAGS.items():
        overrides[key] = tuple(options[flag]) if options.get(flag) else None
    return overrides


def resolve_sampling(options: dict[str, Any], preset: str | None = None) -> tuple[str, SamplingConfig]:
    """Preset (or ``--preset-file``) with the flags on top; bad values name the flag."""
    name, cfg = preset_store.load(preset or options.get("preset"), options.get("preset_file"))
    try:
        cfg = cfg.with_overrides(**sampling_overrides(options))
    except ConfigError as exc:
        raise UserError(f"--{REPEATED_FLAGS.get(exc.key, exc.key).replace('_', '-')}: {exc.reason}") from exc
    constraint = constraint_from(options)  # a bad schema, regex or grammar fails here, before the model loads
    return name, cfg.with_overrides(constraint=constraint)


def constraint_from(options: dict[str, Any]) -> Constraint | None:
    """The constraint the command's flags ask for (None: none), read into typed flags."""
    from llmsample.sampling.constraint import ConstraintFlags, from_flags
    from llmsample.sampling.lenient import warning as unenforced

    flags = ConstraintFlags(
        json=bool(options.get("json")),
        json_schema=options.get("json_schema"),
        regex=options.get("regex"),
        choice=tuple(options.get("choice") or ()),
        grammar=options.get("grammar"),
        strict_schema=bool(options.get("strict_schema")),
    )
    constraint = from_flags(flags)
    warning = unenforced(constraint.origin, constraint.ignored) if constraint is not None else None
    if warning:
        click.echo(f"Warning: {warning}", err=True)
    return constraint


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


def load_model_with_progress(options: dict[str, Any]) -> LoadedModel:
    """Load with progress on stderr: the first run converts the default model (tens of seconds)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from llmsample.models.loading import load_model
    from llmsample.terminal import stderr_console

    spec = (options["model"], options["device"], options["dtype"])
    compile_model = options.get("compile_model", False)
    scaling = {
        "placement": placement_from_options(options),
        "quantize": options.get("quantize"),
        "tensor_parallel": options.get("tp", False),
        "backend": options.get("backend", "auto"),
        "gguf_type": options.get("gguf_type"),
    }
    if options.get("quiet"):
        lm = load_model(*spec, compile=compile_model, **scaling)
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        console = stderr_console()
        # Off the terminal a live display only adds blank lines; step messages still print.
        with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
            task = progress.add_task(f"loading {options['model'] or 'the default model'}", total=None)
            lm = load_model(*spec, progress=progress, compile=compile_model, **scaling)
            progress.remove_task(task)
    lm.deterministic = bool(options.get("deterministic"))
    return lm


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
