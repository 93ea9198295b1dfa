"""The sampling, constraint and ``--watch`` options, and turning them with a preset into a config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmsample.commands.option_group import check_utf8_option, option_group
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


common_sampling_options = option_group(
    click.option("--preset", metavar="NAME", help="A preset from `llmsample presets list` [default: balanced]."),
    click.option("--preset-file", type=click.Path(path_type=Path, dir_okay=False), help="A preset TOML file."),
    click.option("--temperature", "-t", type=float, help="0 (or <= 1e-4) is greedy."),
    click.option("--top-k", type=int, help="Keep the k most likely tokens; 0 is off."),
    click.option("--top-p", type=float, help="Keep the smallest set reaching this mass; 1 is off."),
    click.option("--min-p", type=float, help="Drop tokens below min_p x the top probability; 0 is off."),
    click.option("--seed", type=int, help="Seed for the draws: same seed, same text."),
    click.option("--max-tokens", "-n", type=int, help="Most tokens to generate."),
    panel="Sampling",
)


penalty_options = option_group(
    click.option("--repetition-penalty", type=float, help="CTRL's, > 0; 1 is off."),
    click.option("--frequency-penalty", type=float, help="OpenAI's, in [-2, 2]."),
    click.option("--presence-penalty", type=float, help="OpenAI's, in [-2, 2]."),
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
    click.option("--no-repeat-ngram-size", type=int, help="Never repeat an n-gram of this many tokens; 0 is off."),
    panel="Penalties",
)


token_options = option_group(
    click.option(
        "--stop", multiple=True, metavar="TEXT", callback=check_utf8_option, help="Stop before this text (repeatable)."
    ),
    click.option("--min-tokens", type=int, help="No end-of-sequence or stop string before this many tokens."),
    click.option(
        "--reasoning-budget",
        type=int,
        metavar="N",
        help="After N tokens in a <think> block, close it (its closing tokens forced, source 'forced').",
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
    panel="Stops, bans and biases",
)


truncation_options = option_group(
    click.option(
        "--typical-p", type=float, help="Locally typical sampling: keep this mass nearest the entropy; 1 is off."
    ),
    click.option(
        "--top-n-sigma", type=float, help="Keep logits within n standard deviations of the top one; 0 is off."
    ),
    click.option("--epsilon-cutoff", type=float, help="Drop tokens below this probability; 0 is off."),
    click.option("--eta-cutoff", type=float, help="Eta sampling: an entropy-scaled epsilon; 0 is off."),
    click.option("--top-h", type=float, help="Top-h: keep tokens until their entropy reaches h x the total; 0 is off."),
    click.option("--top-a", type=float, help="Drop tokens below a x the top probability squared; 0 is off."),
    click.option(
        "--p-less/--no-p-less", default=None, help="p-less: keep tokens at least as likely as two draws agree."
    ),
    panel="Truncation",
)


lab_options = option_group(
    click.option(
        "--xtc-threshold", type=float, help="XTC: tokens at least this likely are top choices [default: 0.1]."
    ),
    click.option(
        "--xtc-probability", type=float, help="XTC: how often top choices but the least are excluded; 0 is off."
    ),
    click.option("--dynatemp-range", type=float, help="Dynamic temperature: t ± this, hotter when unsure; 0 is off."),
    click.option(
        "--dynatemp-exponent",
        "--dynatemp-exp",
        "dynatemp_exponent",
        type=float,
        help="Dynamic temperature: exponent of the entropy [default: 1].",
    ),
    click.option("--smoothing-factor", type=float, help="Quadratic smoothing of the logits; 0 is off."),
    click.option("--smoothing-curve", type=float, help="Smoothing: 1 quadratic, up to 3 cubic [default: 1]."),
    click.option(
        "--mirostat",
        type=click.IntRange(0, 2),
        help="Mirostat 1 or 2: aim at a surprise of tau bits; replaces top-k etc.",
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
    panel="More samplers",
)


sampling_options = option_group(
    common_sampling_options, penalty_options, token_options, truncation_options, lab_options
)
"""Every sampling flag: the ones people reach for first under Sampling, the rest by family
(``--help`` lists each family under its own heading, in :data:`~llmsample.commands.help.PANELS`' order)."""


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
