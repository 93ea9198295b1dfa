"""The docs cannot drift from the CLI: every ``llmsample ...`` command line in README.md and
docs/*.md (in code blocks, after ``$ `` prompts, in pipes, across ``\\`` continuations, and in
inline code spans) names a subcommand that exists and only flags that command has, checked with
Click's own parser on the real command group. No model is loaded."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from llmsample.cli import main

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Fences whose lines are data, not shell: a "llmsample" inside them is no command line.
NOT_SHELL = {"json", "jsonl", "python", "py", "toml", "html", "lark", "gbnf", "text"}
# Words after which "llmsample" is the package, not the command (pip install, pipx runpip ...).
PACKAGE_VERBS = {"install", "runpip", "inject", "uninstall"}
# Tokens that end one command of a shell line (pipes, lists, redirections, subshells).
SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ";;", "<", ">", ">>", "<<", "2>", "2>&1", "(", ")"}


@dataclass(frozen=True)
class CommandLine:
    where: str  # file:line, for the failure message
    text: str  # the line as written (continuations joined)
    inline: bool  # from an inline `code span` in prose, not a code block


def shell_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join a code block's ``\\`` continuations into one line each, keeping the first line's number."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in block:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        joined.append((number, line))
    if pending is not None:
        joined.append(pending)
    return joined


def command_lines(path: Path) -> list[CommandLine]:
    """Every line of ``path`` that runs llmsample: code blocks' lines and inline code spans."""
    found: list[CommandLine] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    name = path.relative_to(REPO).as_posix()
    in_block, shell, block = False, False, []
    prose: list[tuple[int, str]] = []
    for number, line in enumerate(lines, start=1):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence:
            if in_block:
                if shell:
                    for start, text in shell_lines(block):
                        if runs_llmsample(text):
                            found.append(CommandLine(f"{name}:{start}", text.strip(), inline=False))
                in_block, block = False, []
            else:
                in_block, shell = True, fence.group(2).lower() not in NOT_SHELL
            continue
        if in_block:
            block.append((number, line))
        else:
            prose.append((number, line))
    # Inline spans may wrap across lines of a paragraph: read each paragraph as one string.
    paragraph: list[tuple[int, str]] = []
    for number, line in [*prose, (0, "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        if paragraph:
            text = " ".join(part.strip() for _, part in paragraph)
            for span in re.findall(r"`([^`]+)`", text):
                if re.search(r"(^|[\s|])llmsample\s+[a-z]", span):
                    found.append(CommandLine(f"{name}:{paragraph[0][0]}", span.strip(), inline=True))
        paragraph = []
    return found


def tokens_of(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def runs_llmsample(text: str) -> bool:
    """Whether a shell line calls llmsample (a comment that names it does not; a line the shell
    could not split is kept, so that its test fails and says so)."""
    try:
        tokens = tokens_of(text)
    except ValueError:
        return "llmsample" in text.split("#")[0]
    return any(
        token == "llmsample" and (i == 0 or tokens[i - 1] not in PACKAGE_VERBS) for i, token in enumerate(tokens)
    )


def invocations(line: CommandLine) -> list[list[str]]:
    """The argument lists given to llmsample on one line (a pipe may hold several)."""
    text = line.text
    if line.inline:
        # Prose writes optional parts in brackets and elided ones as "...": neither is a flag.
        text = re.sub(r"\s\[[^\]]*\]", "", text)
        text = re.sub(r"(^|\s)\.\.\.(?=\s|$)", " ", text)
    tokens = tokens_of(text)
    calls: list[list[str]] = []
    current: list[str] | None = None
    for index, token in enumerate(tokens):
        if token in SHELL_OPERATORS:
            if current is not None:
                # "2>" splits as an argument "2" and an operator ">": the "2" is the shell's.
                if token.startswith(">") and current and current[-1].isdigit():
                    current.pop()
                calls.append(current)
            current = None
            continue
        if current is None:
            # "pip install llmsample", "pipx runpip llmsample ...": the package, not the command.
            if token == "llmsample" and (index == 0 or tokens[index - 1] not in PACKAGE_VERBS):
                current = []
            continue
        current.append(token)
    if current is not None:
        calls.append(current)
    return calls


CONVERTED_TYPES = (click.Choice, click.types.IntParamType, click.types.FloatParamType)


def problems(args: list[str]) -> list[str]:
    """What is wrong with ``llmsample ARGS`` as Click reads it: an unknown subcommand or flag, a
    flag without its value, an extra argument, or a value its option's type refuses (choices,
    numbers); values are not otherwise checked (a doc's file names need not exist here)."""
    command: click.Command = main
    ctx = click.Context(main, info_name="llmsample")
    while isinstance(command, click.Group):
        if not args:
            return []
        if args[0].startswith("-"):
            break  # `llmsample --help`, `llmsample --version`
        sub = command.get_command(ctx, args[0])
        if sub is None:
            return [f"no subcommand {args[0]!r} in {ctx.command_path!r}"]
        ctx = click.Context(sub, info_name=args[0], parent=ctx)
        command, args = sub, args[1:]
    parser = command.make_parser(ctx)
    try:
        values, extra, _ = parser.parse_args(args=list(args))
    except click.UsageError as exc:
        return [f"{ctx.command_path}: {exc.format_message()}"]
    found = []
    if extra and not command.allow_extra_args:
        found.append(f"{ctx.command_path}: unexpected extra arguments {extra}")
    for param in command.params:
        if not isinstance(param, click.Option) or param.name not in values:
            continue
        if param.is_flag or param.count or not isinstance(param.type, CONVERTED_TYPES):
            continue
        given = values[param.name]
        for value in given if isinstance(given, (list, tuple)) else [given]:
            if not isinstance(value, str) or re.fullmatch(r"[A-Z][A-Z_]*", value):
                continue  # a placeholder such as N or P
            try:
                param.type.convert(value, param, ctx)
            except click.BadParameter as exc:
                found.append(f"{ctx.command_path} {param.opts[0]}: {exc.format_message()}")
    return found


ALL_LINES = [line for path in DOCS for line in command_lines(path)]


def test_the_docs_have_command_lines() -> None:
    """The extraction itself works: README and docs/ hold plenty of command lines, in blocks and
    inline, and every subcommand of the CLI appears in at least one of them."""
    assert (REPO / "docs").is_dir()
    assert len([line for line in ALL_LINES if not line.inline]) > 50
    assert any(line.inline for line in ALL_LINES)
    named = {call[0] for line in ALL_LINES for call in invocations(line) if call}
    commands = set(main.list_commands(None))  # imported when asked for: each must load, named as listed
    assert all(main.get_command(None, name).name == name for name in commands)  # type: ignore[union-attr]
    assert commands <= named, f"subcommands no doc shows: {commands - named}"


@pytest.mark.parametrize("line", ALL_LINES, ids=lambda line: line.where)
def test_a_documented_command_line_parses(line: CommandLine) -> None:
    calls = invocations(line)
    assert calls, f"{line.where}: no llmsample call found in {line.text!r}"
    for args in calls:
        assert not problems(args), f"{line.where}: {line.text}\n" + "\n".join(problems(args))


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ('llmsample generate -p "hi" --no-such-flag', "No such option"),
        ("echo hi | llmsample generate --raw \\\n    --temprature 0.5", "No such option"),
        ("llmsample generaet -p hi", "no subcommand"),
        ("$ llmsample presets shw creative", "no subcommand"),
        ("llmsample generate -p hi --dtype float64", "float64"),
        ("llmsample generate -p hi -n many", "many"),
        ("llmsample generate -p hi extra", "extra arguments"),
    ],
)
def test_the_check_catches_a_wrong_line(text: str, wrong: str) -> None:
    """A doc line naming a flag or subcommand that does not exist (or a value its type refuses)
    fails the check: planted lines, parsed exactly as the docs' lines are."""
    line = CommandLine("planted", " ".join(shell_lines(list(enumerate(text.split("\n"))))[0][1].split()), False)
    found = [problem for args in invocations(line) for problem in problems(args)]
    assert any(wrong in problem for problem in found), found


def test_the_check_passes_a_right_line() -> None:
    text = "cat q.txt | LLMSAMPLE_HOME=/tmp llmsample batch - --tokens none -o out.jsonl 2> err.txt"
    calls = invocations(CommandLine("planted", text, False))
    assert calls == [["batch", "-", "--tokens", "none", "-o", "out.jsonl"]]
    assert problems(calls[0]) == []


# Flags the docs name that belong to other tools: torchrun, pip, and the old bench scripts figures were measured with.
OTHER_TOOLS_FLAGS = {
    "--help",
    "--preinstall",  # pipx
    "--nnodes",
    "--nproc-per-node",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--no-deps",
    "--clients",
    "--requests",
    "--rows",
    "--rounds",  # experiments/'s scripts
}


def every_llmsample_flag(command: click.Command) -> set[str]:
    flags = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
    if isinstance(command, click.Group):  # every command, imported or not (they load when run)
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            flags |= every_llmsample_flag(command.get_command(ctx, name))
    return {flag for flag in flags if flag.startswith("--")}


def test_every_flag_named_in_prose_exists() -> None:
    """Prose names flags outside command lines too (`--max-queue`, `--backend-b`): each must be a
    flag of some llmsample command (or one of the few other tools' flags the docs mention)."""
    known = every_llmsample_flag(main) | OTHER_TOOLS_FLAGS
    unknown = {
        f"{path.relative_to(REPO).as_posix()}: {flag}"
        for path in DOCS
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", path.read_text(encoding="utf-8"))
        if flag not in known
    }
    assert not unknown, sorted(unknown)


def test_the_readme_stays_a_few_screens() -> None:
    """Issue 38: the README is the first screen (at most 250 lines, the two `make` commands near
    the top); everything else goes to a page under docs/, and dated figures to docs/history/."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    top = "\n".join(readme.splitlines()[:40])
    assert "make demo" in top and "make test" in top
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", readme), "dated measurements belong in docs/history/"


# Options whose value is a file the command writes: it need not exist before.
WRITTEN = {"-o", "--output", "--html"}
INPUT_FILE = re.compile(r"[\w./-]+\.(?:txt|json|jsonl|toml|lark|gbnf|py|gguf)")


def test_the_files_the_readmes_examples_read_ship_with_it() -> None:
    """Issue 60: a README example runs as printed from the repository root, so every file it reads
    (``--json-schema docs/examples/person.json``, ``batch docs/examples/questions.txt``, a prompt
    in ``$(cat ...)``) is in the repository; a file it writes (``-o``, ``--html``) need not be."""
    missing = []
    for line in command_lines(REPO / "README.md"):
        tokens = tokens_of(line.text)
        for index, token in enumerate(tokens):
            if index and tokens[index - 1] in WRITTEN:
                continue
            missing += [f"{line.where}: {name}" for name in INPUT_FILE.findall(token) if not (REPO / name).is_file()]
    assert not missing, missing


def _prose(path: str) -> str:
    """A doc's text with its line breaks and runs of spaces as single spaces (sentences wrap)."""
    return " ".join((REPO / path).read_text(encoding="utf-8").split())


def _table(path: str, heading: str) -> list[list[str]]:
    """The cells of each row of the first table after ``heading`` in ``path``."""
    lines = (REPO / path).read_text(encoding="utf-8").split(heading, 1)[1].split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[start + 2 : end]]


def _said(text: str) -> str:
    """A reason as prose writes it, compared with the code's: no code marks, case or final stop."""
    return text.replace("`", "").rstrip(".").lower()


def test_the_keys_the_docs_list_as_ignored_are_the_servers() -> None:
    """docs/serve-api.md's keys ignored with a warning are the server's own tables of them (chat's
    and completions', the Responses API's, the Messages API's), and each row's reason is the one
    the server's warning gives: a doc cannot claim a reason the code does not (a prompt cache
    said to be missing while the server keeps one)."""
    from llmsample.serve import compat, messages_api, responses_api

    rows = _table("docs/serve-api.md", "## Other clients' keys")
    ignored = {key: row[3] for row in rows if row[2] == "ignored" for key in re.findall(r"`([^`]+)`", row[0])}
    elsewhere = {"messages[].name", "stream_options.continuous_usage_stats"}  # read where the body is parsed
    assert set(ignored) == set(compat.HINTS) | elsewhere
    for key, reason in compat.HINTS.items():
        assert _said(ignored[key]).startswith(_said(reason)), (key, ignored[key], reason)
    for heading, table, checked in (
        ("## The Responses API", responses_api.HINTS, {"text.verbosity", "store", "include", "truncation"}),
        ("## The Messages API", messages_api.HINTS, set()),
    ):
        [keys] = [row[0] for row in _table("docs/serve-api.md", heading) if "ignored" in row[1]]
        listed = {re.split(r"[: ]", key)[0] for key in re.findall(r"`([^`]+)`", keys)}
        assert listed == set(table) | checked, heading
    # The server keeps a prompt cache across requests (serve --prompt-cache-mb): no reason denies it.
    assert "--prompt-cache-mb" in every_llmsample_flag(main.get_command(None, "serve"))  # type: ignore[arg-type]
    reasons = [*ignored.values(), *compat.HINTS.values(), *responses_api.HINTS.values(), *messages_api.HINTS.values()]
    assert not [reason for reason in reasons if "no prompt cache" in _said(reason)]


EXIT_STATEMENTS = [
    # (doc, the words of the statement before its exit code, generate's arguments that make it happen)
    ("docs/constraints.md", "the output is incomplete under", ["--choice", "yes", "--max-tokens", "1"]),
    ("docs/constraints.md", "an invalid schema, regex or grammar file", ["--regex", "["]),
    ("docs/constraints.md", "a stage that leaves it no way to finish", ["--choice", "yes", "--ban", "s"]),
    ("docs/constraints.md", "a stage that leaves it no way to finish", ["--choice", "yes", "--min-tokens", "5"]),
]


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.constraints.conftest import make_byte_model

    return make_byte_model(tmp_path_factory.mktemp("byte-docs"))


def test_every_exit_code_the_constraints_doc_states_is_checked() -> None:
    stated = re.findall(r"\bexits? (\d)", _prose("docs/constraints.md"))
    checked = {words for doc, words, _ in EXIT_STATEMENTS if doc == "docs/constraints.md"}
    assert len(stated) == len(checked), "a statement of an exit code that EXIT_STATEMENTS does not check"


@pytest.mark.parametrize(("doc", "words", "args"), EXIT_STATEMENTS, ids=lambda value: str(value)[:40])
def test_a_documented_exit_code_is_the_commands(byte_model: Path, doc: str, words: str, args: list[str]) -> None:
    """Each exit code a doc states, by its statement's words, is what ``generate`` exits with
    when the statement's case happens (on a tiny byte-level model)."""
    from click.testing import CliRunner

    found = re.search(re.escape(words) + r"[^.]*?\bexits? (\d)|\bexits? (\d)[^.]*?" + re.escape(words), _prose(doc))
    assert found, f"{doc}: no exit code stated with {words!r}"
    stated = int(found.group(1) or found.group(2))
    result = CliRunner().invoke(main, ["generate", "-m", str(byte_model), "--raw", "-p", "hi", "--device", "cpu", *args])
    assert result.exit_code == stated, (doc, words, result.output)
