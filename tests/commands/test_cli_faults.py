"""Faults around the CLI: standard streams that are closed or fail, signals while a run shuts
down, bytes that are not UTF-8 in arguments and file names, ``--html`` that cannot be written,
and JSON that must stay strict. Real subprocesses wherever the behaviour belongs to processes,
streams or signals."""

from __future__ import annotations

import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.commands.options import read_prompt
from llmsample.errors import RuntimeFailure
from llmsample.render.jsonout import strict_json
from tests.conftest import TEST_HOME, cli_env, make_tiny_model

LLMSAMPLE = [sys.executable, "-m", "llmsample"]


def generate_args(model: Path, *extra: str) -> list[str]:
    return ["generate", "-m", str(model), "--raw", "-p", "w3 w4", "-n", "20", "--seed", "1", "--ignore-eos",
            "--device", "cpu", *extra]  # fmt: skip


def shell(command: str) -> subprocess.CompletedProcess[bytes]:
    """``llmsample ARGS`` with shell redirections, e.g. ``shell(f"{cli(args)} > /dev/full")``;
    block-buffered as for a user (no PYTHONUNBUFFERED), so data is still pending at exit."""
    env = {k: v for k, v in cli_env().items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(["bash", "-c", command], capture_output=True, env=env, timeout=180)


def cli(args: list[str]) -> str:
    return shlex.join([*LLMSAMPLE, *args])


def assert_one_line_error(result: subprocess.CompletedProcess[bytes], code: int, fragment: str) -> None:
    err = result.stderr.decode("utf-8")  # strict: the error line itself must be valid UTF-8
    assert result.returncode == code, err
    assert err.startswith("Error: ") and err.count("\n") == 1 and fragment in err, err
    assert "Traceback" not in err and "Exception ignored" not in err


def jsonl(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.decode("utf-8").splitlines()]


# --- 2: JSON output is strict --------------------------------------------------------------------


def test_strict_json_names_the_non_finite_field() -> None:
    assert strict_json({"text": "é", "prob": 0.5}) == '{"text": "é", "prob": 0.5}'
    with pytest.raises(RuntimeFailure, match=r"top\[1\]\.prob is NaN or infinite"):
        strict_json({"top": [{"prob": 0.5}, {"prob": math.nan}]})
    with pytest.raises(RuntimeFailure, match="NaN or infinite"):
        strict_json(math.inf)


NON_FINITE = {
    "generate": ("llmsample.events.TokenEvent.to_dict", lambda self: {"type": "token", "prob": math.nan}, []),
    "compare-presets": ("llmsample.analysis.text_metrics.perplexity", lambda logprob: math.inf, ["--presets", "deterministic"]),
    "explain": ("llmsample.analysis.explain.ChainReport.to_dict", lambda self: {"entropy": math.nan}, []),
    "explain --continuation": (
        "llmsample.analysis.explain.ScoredToken.to_dict", lambda self: {"prob": -math.inf}, ["--continuation", "w5 w6"]
    ),
    "explain --layers": ("llmsample.analysis.lens_records.LayerReport.to_dict", lambda self: {"probs": [math.nan]}, ["--layers"]),
    "explain --tree": ("llmsample.engine.tree.Branch.to_dict", lambda self: {"path_prob": math.nan}, ["--tree", "2"]),
}  # fmt: skip


@pytest.mark.parametrize("case", NON_FINITE)
def test_jsonl_never_writes_nan_or_infinity(case: str, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target, fake, extra = NON_FINITE[case]
    monkeypatch.setattr(target, fake)
    command = case.split()[0]
    args = [command, "-m", str(tiny_model_dir), "--raw", "-p", "w3 w4", "-n", "4", "--format", "jsonl", "-q", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout
    assert result.stderr.count("\n") == 1 and "is NaN or infinite" in result.stderr, result.stderr


def test_presets_show_is_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmsample.sampling.config.SamplingConfig.as_dict", lambda self: {"temperature": math.inf})
    result = CliRunner().invoke(main, ["presets", "show", "balanced"])
    assert result.exit_code == 1 and "Infinity" not in result.stdout
    assert "temperature is NaN or infinite" in result.stderr


# --- 6: arguments that are not UTF-8 fail before the model loads --------------------------------


@pytest.mark.parametrize(
    "args",
    [
        [b"generate", b"-p", b"caf\xe9"],
        [b"generate", b"-p", b"hi", b"--system", b"\xff you are"],
        [b"generate", b"-p", b"hi", b"--stop", b"\xc3"],
        [b"explain", b"-p", b"hi", b"--continuation", b"caf\xe9"],
        [b"compare-presets", b"-p", b"caf\xe9 au lait"],
    ],
    ids=["prompt", "system", "stop", "continuation", "compare-presets"],
)
def test_invalid_utf8_arguments_are_one_line_before_the_model_loads(args: list[bytes], tmp_path: Path) -> None:
    # The model does not exist: a check after the load would report the model instead.
    model = [b"-m", os.fsencode(tmp_path / "no-such-model")]
    result = subprocess.run(
        [os.fsencode(a) for a in LLMSAMPLE] + args[:1] + model + args[1:],
        capture_output=True, env=cli_env(), timeout=120,
    )  # fmt: skip
    assert_one_line_error(result, 2, "is not valid UTF-8 (byte ")
    assert result.stdout == b""


def test_the_byte_offset_counts_bytes() -> None:
    result = CliRunner().invoke(main, ["generate", "-p", "né\udce9", "-m", "x"])
    assert result.exit_code == 2 and "--prompt is not valid UTF-8 (byte 3)" in result.stderr


# --- 7: closed and failing standard streams --------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "jsonl"])
def test_stdout_to_a_full_disk_is_one_line_and_exit_1(tiny_model_dir: Path, fmt: str) -> None:
    result = shell(f"{cli(generate_args(tiny_model_dir, '--format', fmt))} > /dev/full")
    assert_one_line_error(result, 1, "cannot write to stdout (No space left on device)")


def test_a_full_disk_while_printing_a_table_is_one_line() -> None:
    result = shell(f"{cli(['presets', 'list'])} > /dev/full")
    assert_one_line_error(result, 1, "cannot write to stdout")


def test_closed_stdout_fails_at_once(tiny_model_dir: Path) -> None:
    result = shell(f"{cli(generate_args(tiny_model_dir))} >&-")
    assert_one_line_error(result, 1, "stdout is closed")


def test_closed_stdin_is_a_missing_prompt(tiny_model_dir: Path) -> None:
    result = shell(f"{cli(['generate', '-m', str(tiny_model_dir)])} <&-")
    assert_one_line_error(result, 2, "stdin is closed")
    dash = shell(f"{cli(['generate', '-m', str(tiny_model_dir), '-p', '-'])} <&-")
    assert_one_line_error(dash, 2, "stdin is closed")


@pytest.mark.parametrize("redirect", ["2>&-", "2>/dev/full"])
def test_closed_or_full_stderr_keeps_the_data_on_stdout(tiny_model_dir: Path, redirect: str) -> None:
    result = shell(f"{cli(generate_args(tiny_model_dir, '--format', 'jsonl', '--inspect'))} {redirect}")
    assert result.returncode == 0, result.stderr
    records = jsonl(result.stdout)
    assert records[-1]["type"] == "summary" and records[-1]["tokens"] == 20 == len(records) - 1
    assert result.stderr == b""


# --- 9: --html is checked before the work, and written whole or not at all ------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB file system: an HTML page of a few dozen tokens does not fit."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """Root ignores permission bits, so a read-only mount is the honest unwritable directory."""
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=16k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("command", ["generate", "compare-presets"])
def test_html_path_is_checked_before_the_model_loads(command: str, tmp_path: Path, read_only_dir: Path) -> None:
    (tmp_path / "taken").mkdir()
    cases = {
        "": "is empty",
        str(tmp_path / "taken"): "is a directory",
        str(tmp_path / "missing" / "x.html"): "does not exist",
        str(read_only_dir / "x.html"): "Read-only file system",
    }
    for html, fragment in cases.items():
        # The model does not exist: a check after the load would report the model instead.
        args = [command, "-m", str(tmp_path / "no-such-model"), "-p", "hi", "--html", html]
        result = subprocess.run([*LLMSAMPLE, *args], capture_output=True, env=cli_env(), timeout=120)
        assert_one_line_error(result, 2, fragment)
        assert result.stdout == b""


def test_html_on_a_full_disk_leaves_nothing_half_written(tiny_model_dir: Path, small_tmpfs: Path) -> None:
    page = small_tmpfs / "page.html"
    page.write_text("the previous page")
    args = [*generate_args(tiny_model_dir, "--html", str(page)), "-n", "100"]
    result = subprocess.run([*LLMSAMPLE, *args], capture_output=True, env=cli_env(), timeout=120)
    assert_one_line_error(result, 1, "cannot write --html")
    assert "nothing was written" in result.stderr.decode()
    assert result.stdout.strip()  # the text itself was printed
    assert [p.name for p in small_tmpfs.iterdir()] == ["page.html"]  # no temporary file left behind
    assert page.read_text() == "the previous page"


def test_html_replaces_the_file_whole(tiny_model_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    page.write_text("old")
    result = CliRunner().invoke(main, [*generate_args(tiny_model_dir, "--html", str(page)), "-q"])
    assert result.exit_code == 0, result.output
    assert page.read_text().startswith("<!doctype html>") and [p.name for p in tmp_path.iterdir()] == ["page.html"]


# --- 12: file names that are not UTF-8 --------------------------------------------------------------


def test_non_utf8_preset_file_name_gives_valid_output(tiny_model_dir: Path, tmp_path: Path) -> None:
    preset = tmp_path / os.fsdecode(b"\xff-mine.toml")
    preset.write_text("top_k = 3\n")
    result = subprocess.run(
        [*LLMSAMPLE, *generate_args(tiny_model_dir, "--format", "jsonl", "--preset-file", str(preset))],
        capture_output=True, env=cli_env(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert jsonl(result.stdout)[-1]["preset"] == "\\xff-mine"  # jsonl() decodes strictly


def test_non_utf8_user_preset_name_is_listed_as_valid_text(tmp_path: Path) -> None:
    user = tmp_path / "config" / "llmsample" / "presets"
    user.mkdir(parents=True)
    (user / os.fsdecode(b"caf\xe9.toml")).write_text('description = "mine"\n')
    result = subprocess.run([*LLMSAMPLE, "presets", "list"], capture_output=True, timeout=120,
                            env=cli_env(XDG_CONFIG_HOME=str(tmp_path / "config")))  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode("utf-8")
    assert "caf\\xe9" in out and "mine" in out


# --- 13: a chat prompt on stdin asks the same question as -p -------------------------------------


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose chat template keeps every character of the message (as JSON), so a
    trailing newline changes the prompt's tokens."""
    path = make_tiny_model(tmp_path_factory.mktemp("chat"))
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{{ messages | tojson }}"
    config_path.write_text(json.dumps(config))
    return path


def test_chat_prompt_from_stdin_loses_the_trailing_newline(chat_model_dir: Path) -> None:
    args = ["generate", "-m", str(chat_model_dir), "-n", "5", "--seed", "2", "--ignore-eos", "--format", "jsonl"]
    flag = CliRunner().invoke(main, [*args, "-p", "w3 w4"])
    piped = CliRunner().invoke(main, args, input="w3 w4\n")
    with_crlf = CliRunner().invoke(main, [*args, "-p", "-"], input="w3 w4\r\n\n")
    summaries = [jsonl(r.stdout_bytes)[-1] for r in (flag, piped, with_crlf)]
    assert summaries[0]["prompt_tokens"] == summaries[1]["prompt_tokens"] == summaries[2]["prompt_tokens"]
    assert summaries[0]["text"] == summaries[1]["text"] == summaries[2]["text"]


def test_raw_stdin_stays_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Once upon a time\n")))
    assert read_prompt("-", raw=True) == "Once upon a time\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"  indented\n\n")))
    assert read_prompt("-") == "  indented"


# --- smaller items ---------------------------------------------------------------------------------


@pytest.mark.parametrize("names", ["", ",", " , "])
def test_empty_presets_list_is_an_error(names: str, tmp_path: Path) -> None:
    args = ["compare-presets", "-m", str(tmp_path / "no-such-model"), "-p", "hi", "--presets", names]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "--presets is empty" in result.stderr


def test_presets_list_shows_the_good_ones_and_flags_a_broken_file(tmp_path: Path) -> None:
    user = tmp_path / "config" / "llmsample" / "presets"
    user.mkdir(parents=True)
    (user / "good.toml").write_text('description = "works"\n')
    (user / "broken.toml").write_text("top_k = \n")
    (user / "wrong.toml").write_text("top_p = 7\n")
    result = CliRunner().invoke(main, ["presets", "list"])
    assert result.exit_code == 0
    assert "good" in result.stdout and "works" in result.stdout and "balanced" in result.stdout
    assert "broken" not in result.stdout and "wrong" not in result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("Warning: ") for line in lines)
    assert "broken.toml" in lines[0] and "wrong.toml" in lines[1] and "top_p" in lines[1]


def patched_cli(patch: str, args: list[str]) -> list[str]:
    """Run the CLI in a subprocess after ``patch`` (Python source): to deliver a real signal at an
    exact point of the run."""
    script = f"import os, signal, sys, time\n{patch}\nfrom llmsample.cli import main\nmain()"
    return [sys.executable, "-c", script, *args]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_while_shutting_down_is_ignored(tiny_model_dir: Path, sig: int, code: int) -> None:
    # The second signal arrives while the summary line is being written, after the first one
    # stopped generation.
    patch = f"""
import llmsample.render.stream as stream
lines = stream.summary_lines
def summary_lines(summary, *rest):
    os.kill(os.getpid(), {int(sig)})
    time.sleep(0.2)
    return lines(summary, *rest)
stream.summary_lines = summary_lines
"""
    args = [*generate_args(tiny_model_dir, "--format", "jsonl"), "-n", "100000"]
    proc = subprocess.Popen(patched_cli(patch, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    first = proc.stdout.readline()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert jsonl(out)[-1]["stop_reason"] == "interrupted" and json.loads(first)["type"] == "token"
    assert "Traceback" not in err.decode() and "stop: interrupted" in err.decode()


def test_sighup_ends_like_sigterm_with_a_summary(tiny_model_dir: Path) -> None:
    args = [*LLMSAMPLE, *generate_args(tiny_model_dir, "--format", "jsonl"), "-n", "100000"]
    # Unbuffered: a buffered readline reads ahead, and communicate() then skips what it buffered.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(), bufsize=0)
    lines = [proc.stdout.readline()]
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=60)
    records = jsonl(b"".join(lines) + out)
    assert proc.returncode == 129, err
    assert records[-1]["type"] == "summary" and records[-1]["stop_reason"] == "interrupted"
    assert records[-1]["tokens"] == len(records) - 1 and b"Traceback" not in err


# Interrupt compare-presets with a real signal once the second preset has produced one token
# (the greedy reference before them decodes through the engine's run_many too, as the presets'
# samples do: its call is the first, the second preset's the third).
INTERRUPT_SECOND_PRESET = """
from llmsample.api.local import LocalEngine
rows = LocalEngine.run_many
started = []
def interrupted_rows(self, *args, **kwargs):
    started.append(1)
    for n, item in enumerate(rows(self, *args, **kwargs)):
        if len(started) == 3 and n == 1:
            os.kill(os.getpid(), {sig})
            time.sleep(0.2)
        yield item
LocalEngine.run_many = interrupted_rows
"""


@pytest.mark.parametrize(("sig", "code", "fmt"), [(signal.SIGINT, 130, "jsonl"), (signal.SIGTERM, 143, "text")])
def test_interrupted_compare_presets_prints_what_finished(tiny_model_dir: Path, sig: int, code: int, fmt: str) -> None:
    args = ["compare-presets", "-m", str(tiny_model_dir), "--raw", "-p", "w3 w4", "-n", "6", "--format", fmt,
            "--presets", "deterministic,balanced,creative"]  # fmt: skip
    patch = INTERRUPT_SECOND_PRESET.format(sig=int(sig))
    result = subprocess.run(patched_cli(patch, args), capture_output=True, env=cli_env(), timeout=120)
    assert result.returncode == code, result.stderr
    assert b"Traceback" not in result.stderr
    out = result.stdout.decode()
    if fmt == "jsonl":
        records = jsonl(result.stdout)
        assert [r["preset"] for r in records] == ["deterministic", "balanced"]
        assert "interrupted" not in records[0] and records[1]["interrupted"] is True
        assert records[1]["tokens"] == 1
    else:
        assert "deterministic" in out and "balanced" in out and "creative" not in out
        assert out.count("[interrupted]") == 1


# --- issue 25, item 10: a home this user cannot read -----------------------------------------------

# root reads every directory (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH); without those two
# capabilities it obeys permission bits like any other user, while still running this venv's
# python (under root's own home, which `nobody` could not run).
NO_ROOT_POWERS = [
    "setpriv",
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


@pytest.fixture
def unreadable_home(tmp_path: Path) -> Iterator[tuple[Path, list[str]]]:
    """A home directory with mode 000 and the command prefix that makes this run obey it."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        try:
            done = subprocess.run([*NO_ROOT_POWERS, "true"], capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("root ignores permission bits, and setpriv (util-linux) is not installed to drop that")
        if done.returncode:
            pytest.skip(f"root ignores permission bits, and cannot drop that here: {done.stderr.strip()}")
        prefix = NO_ROOT_POWERS
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    home.chmod(0)
    try:
        yield home, prefix
    finally:
        home.chmod(0o755)


def as_user_of(home: Path, prefix: list[str], args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``llmsample ARGS`` for a user whose $HOME is ``home`` and who has no XDG or llmsample
    directories set (``sudo -u nobody`` without ``-H``)."""
    unset = ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "LLMSAMPLE_HOME")
    base = {k: v for k, v in cli_env().items() if k not in unset}
    return subprocess.run([*prefix, *LLMSAMPLE, *args], capture_output=True, text=True, timeout=180,
                          env={**base, "HOME": str(home), **env})  # fmt: skip


def test_an_unreadable_home_leaves_the_built_in_presets(tiny_model_dir: Path, unreadable_home) -> None:
    home, prefix = unreadable_home
    listed = as_user_of(home, prefix, ["presets", "list"])
    assert listed.returncode == 0, listed.stderr
    assert "balanced" in listed.stdout and "deterministic" in listed.stdout and "built-in" in listed.stdout
    warning = f"Warning: cannot read the user preset directory {home}/.config/llmsample/presets (Permission denied)"
    assert listed.stderr.startswith(warning) and listed.stderr.count("\n") == 1, listed.stderr
    shown = as_user_of(home, prefix, ["presets", "show", "deterministic"])
    assert shown.returncode == 0 and "temperature = 0.0" in shown.stdout and shown.stderr.startswith(warning)
    # a model given by path needs no cache: the run goes through, warned once
    ran = as_user_of(home, prefix, generate_args(tiny_model_dir, "-q"), LLMSAMPLE_HOME=str(TEST_HOME))
    assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
    first, *others = ran.stderr.splitlines()  # warned once for the presets, once for the run log under it
    assert first.startswith(warning) and [line[:50] for line in others] == ["Warning: the run was not logged (Permission denied"]
    compared = as_user_of(home, prefix, ["compare-presets", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-n", "3",
                                         "--presets", "balanced,deterministic,creative"])  # fmt: skip
    assert compared.returncode == 0 and compared.stderr.count("Warning: ") == 1, compared.stderr


def test_an_unreadable_home_without_a_cache_is_one_line(tiny_model_dir: Path, unreadable_home) -> None:
    home, prefix = unreadable_home
    for args in (["generate", "-p", "hi", "-n", "3"], ["models"]):
        result = as_user_of(home, prefix, args)
        assert result.returncode == 2, result.stderr
        lines = [line for line in result.stderr.splitlines() if not line.startswith("Warning: ")]
        assert lines == [
            f"Error: cannot read the model cache {home}/.cache/llmsample (Permission denied); make it readable, "
            "or point LLMSAMPLE_HOME at a directory you can write"
        ], result.stderr
    # a model by path runs anyway: the cache is only cleaned up when it can be read
    ran = as_user_of(home, prefix, generate_args(tiny_model_dir, "-q"))
    assert ran.returncode == 0, ran.stderr
