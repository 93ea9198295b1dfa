"""Constrained generation: JSON (any object or a schema), a regex, a choice of texts or a grammar,
compiled by llguidance into a matcher per row. The matcher gives each position's allowed tokens
(EOS exactly where the grammar accepts), which the ``constraint`` stage of the chain applies
before every truncation filter; the loop advances the matcher along emitted tokens, and the
speculative step asks it for the masks after each draft, rolled back afterwards.

Compiling and checking a constraint needs no tokenizer, so a bad schema, regex or grammar fails
in one line before the model loads. The tokenizer's table (about a second on a 49k vocabulary)
is built once per tokenizer and vocabulary size and kept."""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmsample.errors import RuntimeFailure, UserError
from llmsample.sampling import lenient

if TYPE_CHECKING:  # the batch reader compiles constraints and imports no torch
    from torch import Tensor

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON as ``{"a": 1, "b": [2, 3]}``: no free whitespace, so a model cannot pad forever with blanks."""

FLAGS = {
    "json": "--json",
    "json_schema": "--json-schema",
    "regex": "--regex",
    "choice": "--choice",
    "grammar": "--grammar",
}


@dataclass(frozen=True)
class Constraint:
    """A compiled constraint: ``kind`` (a key of ``FLAGS``), ``grammar`` (llguidance's grammar
    text), ``origin`` (the flag or file it came from, for messages). Hashable, so it can sit in a
    :class:`SamplingConfig`."""

    kind: str
    grammar: str = field(repr=False)
    origin: str = ""
    ignored: tuple[str, ...] = ()  # schema keywords left unenforced (lenient): "uniqueItems", "format: hostname"

    @property
    def flag(self) -> str:
        return FLAGS.get(self.kind, self.kind)


ANY = Constraint("any", "")
"""What the step groups by: rows with different constraints share one chain call."""


def _one_line(message: str) -> str:
    """llguidance's message without its source excerpt (``   1 | start: ...``) in one line; a
    regex error keeps the regex crate's reason (``unclosed group``)."""
    lines = [line for line in message.splitlines() if not re.match(r"\s*(\d+ )?\|", line) and line.strip() != "^"]
    text = " ".join(" ".join(lines).split())
    found = re.search(r"regex parse error:.*?error: (.*)$", text)
    return f"invalid regex: {found.group(1)}" if found else text


def _check(grammar: str, origin: str, unsupported: str = "") -> str:
    """The grammar, validated, then run over bytes (:func:`_probe`); a failure is one line."""
    _checked(grammar, origin, unsupported)
    return grammar


def _checked(grammar: str, origin: str, unsupported: str = "") -> list[str]:
    """:func:`_check`, returning llguidance's warnings (what a lenient schema left out)."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        reason = _one_line(messages[0] if messages else "invalid")
        if unsupported and reason.startswith(("Unimplemented keys", "Unknown format", "oneOf constraints")):
            reason += f" ({unsupported})"
        raise UserError(f"{origin}: {reason}")
    _probe(grammar, origin)
    return messages


class _ByteTokens:
    """A vocabulary of the 256 bytes and an EOS: what :func:`_probe` runs a grammar over."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_BYTES: list[Any] = []
PROBED_BYTES = 16
"""How many of the first allowed bytes :func:`_probe` steps over, each undone again."""


def _probe(grammar: str, origin: str) -> None:
    """Run the grammar's first steps over bytes, before any model loads. llguidance validates a
    grammar without running it: a language with no text in it (``[^\\s\\S]``) or a grammar past its
    parser limits (a choice of thousands of alternatives, an ``anyOf`` of thousands of objects)
    would only fail at the first mask or the first token, in the loop other rows share."""
    from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

    if not _BYTES:
        _BYTES.append(LLTokenizer(TokenizerWrapper(_ByteTokens())))
    matcher = LLMatcher(_BYTES[0], grammar, log_level=0)
    mask = matcher.compute_bitmask() if not matcher.is_error() else b""
    allowed = [b for b in range(256) if mask and mask[b // 8] >> (b % 8) & 1]
    for byte in allowed[:PROBED_BYTES]:
        if matcher.is_error():
            break
        matcher.rollback(matcher.try_consume_tokens([byte]))
    if matcher.is_error():
        error = matcher.get_error()
        if "NoExtensionBias" in error and not allowed:
            raise UserError(f"{origin}: matches no text at all; check the constraint")
        raise UserError(f"{origin}: too complex for llguidance ({_reason(error)}); simplify the constraint")


def _reason(error: str) -> str:
    """llguidance's runtime error without its parser state and grammar dump."""
    first = error.split("<state>", 1)[0]
    return " ".join(first.removeprefix("Parser Error:").split()).rstrip(".;")


def json_schema(schema: Any, origin: str = "--json-schema", strict: bool = False) -> Constraint:
    """A JSON Schema (a dict or its text). Lenient by default (:mod:`llmsample.sampling.lenient`):
    what llguidance cannot enforce is left out and named in ``ignored``; ``strict`` refuses such
    a schema, naming the keyword."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise UserError(f"{origin}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
        except RecursionError:
            raise UserError(f"{origin}: nested too deeply for a JSON reader; flatten the schema") from None
    if not isinstance(schema, dict | bool):
        raise UserError(f"{origin}: a JSON Schema is an object, got {type(schema).__name__}")
    if strict:
        return _strict_schema(schema, origin)
    schema, loosened = lenient.loosened(schema)
    options = {**JSON_OPTIONS, **lenient.OPTIONS}
    try:
        grammar, ignored = _schema_grammar(schema, origin, options)
    except UserError as exc:
        dialect = lenient.unknown_dialect(schema, str(exc))
        if dialect is None:
            raise
        grammar, ignored = _schema_grammar({k: v for k, v in schema.items() if k != "$schema"}, origin, options)
        loosened = (f"$schema: {dialect}", *loosened)
    return Constraint("json_schema", grammar, origin, (*loosened, *ignored))


def _strict_schema(schema: Any, origin: str) -> Constraint:
    """Refused when llguidance cannot enforce all of it; the message says when the lenient
    compile (the default) would take it."""
    try:
        return Constraint("json_schema", _schema_grammar(schema, origin, JSON_OPTIONS)[0], origin)
    except UserError as exc:
        try:
            json_schema(schema, origin)
        except UserError:
            raise exc from None
        raise UserError(f"{exc}; without --strict-schema it is left unenforced") from None


def _schema_grammar(schema: Any, origin: str, options: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """llguidance's grammar of the schema, checked, and the keywords its warnings name."""
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=options)  # type: ignore[arg-type]
    except ValueError as exc:
        raise UserError(f"{origin}: {' '.join(str(exc).split())}") from exc
    unsupported = "llguidance does not support this keyword; leave it out of the schema"
    return grammar, lenient.ignored_keywords(_checked(grammar, origin, unsupported))


def any_json(origin: str = "--json") -> Constraint:
    """Any JSON object."""
    return Constraint("json", json_schema({"type": "object"}, origin).grammar, origin)


def regex(pattern: str, origin: str = "--regex") -> Constraint:
    """The whole output matches ``pattern`` (Rust regex syntax, as ``re.fullmatch`` reads most)."""
    from llguidance import LLMatcher

    if not pattern:
        raise UserError(f"{origin}: the pattern is empty")
    return Constraint("regex", _check(LLMatcher.grammar_from_regex(pattern), origin), origin)


def choice(texts: Sequence[str], origin: str = "--choice") -> Constraint:
    """Exactly one of ``texts``."""
    from llguidance import LLMatcher

    if not texts or any(not isinstance(t, str) or not t for t in texts):
        raise UserError(f"{origin}: give one or more non-empty texts")
    # One terminal, so the lexer (a DFA) holds the texts: as alternatives of a rule, thousands of
    # them would overflow one row of llguidance's parser at the first token.
    lark = "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(t) for t in texts)
    return Constraint("choice", _check(LLMatcher.grammar_from_lark(lark), origin), origin)


def grammar(text: str, origin: str = "--grammar", gbnf: bool = False) -> Constraint:
    """A Lark grammar (llguidance's dialect), or llama.cpp's GBNF converted to it."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    if gbnf:
        try:
            text = any_to_lark(text)
        except Exception as exc:  # the converter raises bare exceptions
            raise UserError(f"{origin}: not a GBNF grammar ({' '.join(str(exc).split())})") from exc
    return Constraint("grammar", _check(LLMatcher.grammar_from_lark(text), origin), origin)


def read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not readable UTF-8 text"
        raise UserError(f"{flag} {path}: {reason}") from exc


@dataclass(frozen=True)
class ConstraintFlags:
    """The constraint flags as given (None, False or empty: not given), typed: the commands read
    them from Click's options, so nothing below them takes the options dict."""

    json: bool = False
    json_schema: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] = ()
    grammar: str | None = None
    strict_schema: bool = False  # refuse a schema with keywords llguidance cannot enforce


def from_flags(flags: ConstraintFlags) -> Constraint | None:
    """The one constraint the flags ask for (none given: None; two: an error)."""
    given = [flag for key, flag in FLAGS.items() if getattr(flags, key) not in (None, False, ())]
    if not given:
        return None
    if len(given) > 1:
        raise UserError(f"{given[0]} and {given[1]} are two constraints; give one")
    if flags.json:
        return any_json()
    if flags.json_schema:
        from os.path import exists  # False, not an error, for text no path could be (too long, NUL)

        value = flags.json_schema
        # A file that exists is read, whatever its name starts with (true_schema.json); else
        # text that opens as a schema (an object, or true/false) is the schema itself.
        if not exists(value) and value.lstrip().startswith(("{", "true", "false")):
            return json_schema(value, strict=flags.strict_schema)
        return json_schema(read_text(value, "--json-schema"), f"--json-schema {value}", flags.strict_schema)
    if flags.regex:
        return regex(flags.regex)
    if flags.choice:
        return choice(list(flags.choice))
    path = flags.grammar
    assert path is not None  # the one flag given
    return grammar(read_text(path, "--grammar"), f"--grammar {path}", gbnf=path.endswith(".gbnf"))


_TABLES: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


def tokenizer_table(tokenizer: Any, vocab_size: int, eos_ids: Sequence[int], flag: str = "the constraint") -> Any:
    """llguidance's table of the tokenizer (every token's bytes, a trie): built once per tokenizer
    and vocabulary size, kept as long as the tokenizer. A tokenizer llguidance cannot read (not a
    fast tokenizer, no known decoder) is one line naming ``flag``."""
    tables = _TABLES.setdefault(tokenizer, {})
    if vocab_size not in tables:
        eos = sorted(eos_ids) or None
        try:
            tables[vocab_size] = _llguidance_tokenizer(tokenizer, vocab_size, eos)
        except ValueError as exc:
            raise UserError(f"{flag}: llguidance cannot read this model's tokenizer ({_one_line(str(exc))})") from exc
    return tables[vocab_size]


def _llguidance_tokenizer(tokenizer: Any, vocab_size: int, eos: list[int] | None) -> Any:
    """llguidance's tokenizer: through ``llguidance.hf`` for transformers' tokenizers; for one
    that is not (a llama.cpp run's :class:`~llmsample.models.fast_tokenizer.FastTokenizer`, whose
    run imports no transformers), built from its Rust tokenizer exactly as ``llguidance.hf`` builds
    it (a copy without padding or truncation, serialized)."""
    if type(tokenizer).__module__.startswith("transformers."):
        import llguidance.hf

        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
    from copy import copy

    from llguidance import LLTokenizer

    backend = copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return LLTokenizer(
        backend.to_str(), n_vocab=vocab_size, eos_token=eos if eos is not None else tokenizer.eos_token_id
    )


def unpack(bitmask: Tensor, vocab_size: int) -> Tensor:
    """llguidance's ``[n, words]`` int32 bitmask as ``[n, vocab]`` bool."""
    import torch

    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


_EXECUTOR: list[Any] = []


def _executor() -> Any:
    if not _EXECUTOR:
        from llguidance import LLExecutor

        _EXECUTOR.append(LLExecutor())
    return _EXECUTOR[0]


class Matcher:
    """One row's grammar state: the allowed tokens at the next position (and after drafts), moved
    along the tokens the row emits."""

    def __init__(self, constraint: Constraint, table: Any, vocab_size: int) -> None:
        from llguidance import LLMatcher

        self.constraint = constraint
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.matcher = LLMatcher(table, constraint.grammar, log_level=0)
        self.eos = frozenset(table.eos_tokens)
        if self.matcher.is_error():
            raise UserError(f"{constraint.origin or constraint.flag}: {self.matcher.get_error()}")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows in a row from here (a draft is cut there)."""
        return self.matcher.validate_tokens(list(tokens)) if tokens else 0

    def advance(self, tokens: Sequence[int]) -> None:
        """The row's emitted tokens (an EOS kept by ``--ignore-eos`` is not the grammar's); a
        grammar that fails on them (past llguidance's limits) fails this row alone."""
        tokens = [t for t in tokens if t not in self.eos]
        if tokens and not self.matcher.consume_tokens(tokens):
            raise RuntimeFailure(self.failure() or f"{self.constraint.flag}: the grammar rejected an emitted token")

    def failure(self) -> str | None:
        """Why llguidance stopped this grammar (a parser or lexer limit hit mid-output), in one
        line; None while it works."""
        if not self.matcher.is_error():
            return None
        origin = self.constraint.origin or self.constraint.flag
        return f"{origin}: llguidance failed ({_reason(self.matcher.get_error())})"

    def accepts_after(self, tokens: Sequence[int]) -> bool:
        """Whether the grammar is complete once ``tokens`` are added (the state is kept)."""
        consumed = self.matcher.try_consume_tokens(list(tokens))
        accepting = consumed == len(tokens) and self.matcher.is_accepting()
        self.matcher.rollback(consumed)
        return accepting

    def push(self, token: int) -> bool:
        """One draft token in, to be rolled back (see :meth:`rollback`); False for EOS, which is
        not pushed: llguidance 1.9 does not count an EOS consumed in a stopped state, so rolling
        back over it would undo one token too many."""
        if token in self.eos:
            return False
        if not self.matcher.consume_token(token):
            raise RuntimeFailure(self.failure() or f"{self.constraint.flag}: the grammar rejected a drafted token")
        return True

    @property
    def stopped(self) -> bool:
        """Nothing but EOS can follow."""
        return self.matcher.is_stopped()

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)

    def masks(self, drafts: Sequence[int] = ()) -> Tensor:
        """The allowed tokens at the next position and after each draft, ``[1 + len(drafts), vocab]``."""
        return batch_masks([self], [drafts])


def batch_masks(matchers: Sequence[Matcher], drafts: Sequence[Sequence[int]]) -> Tensor:
    """Every row's masks (the next position, then after each of its drafts) in one call to
    llguidance's executor, which fills them in parallel; rows in order, ``[sum(1 + k), vocab]``."""
    import torch

    total = sum(1 + len(d) for d in drafts)
    words = matchers[0].words
    bitmask = torch.zeros(total, words, dtype=torch.int32)
    plain, drafted, at = [], [], 0
    for matcher, draft in zip(matchers, drafts, strict=True):
        if draft:
            drafted.append((matcher.matcher, at, list(draft)))
        else:
            plain.append((matcher.matcher, at))
        at += 1 + len(draft)
    # Straight into the tensor's memory: llguidance.torch would import its torch.compile path.
    if plain:
        _executor().unsafe_compute_mask_ptr(plain, bitmask.data_ptr(), words * 4, total)
    if drafted:
        _executor().unsafe_compute_mask_ptr_with_draft_token(drafted, bitmask.data_ptr(), words * 4, total)
    return unpack(bitmask, matchers[0].vocab_size)


def incomplete_message(summary: Any) -> str | None:
    """The one line for a constrained output the length limit (a stop string, the context) cut short;
    None when the output is complete or unconstrained."""
    outcome = summary.facts.constraint
    if outcome is None or outcome.complete:
        return None
    if summary.stop_reason == "stop":
        return (
            f"the output is incomplete under {outcome.constraint}: a stop string ended it after {summary.tokens} tokens"
        )
    if summary.stop_reason == "context":
        return (
            f"the output is incomplete under {outcome.constraint}: the model's context ended it after "
            f"{summary.tokens} tokens; shorten the prompt"
        )
    return f"the output is incomplete under {outcome.constraint} after {summary.tokens} tokens; raise --max-tokens"
