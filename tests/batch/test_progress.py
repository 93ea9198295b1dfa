"""``batch``'s progress moves with every token, not only when a request ends: a run tells its
progress of each token as it comes, and the bar's time left is reckoned in tokens."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from llmsample.api.local import LocalEngine
from llmsample.batch.requests import read_requests
from llmsample.batch.run import run_batch
from llmsample.batch.settings import BatchSettings
from llmsample.render.progress import TokenProgress


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def planned(self, rows: int, tokens: int) -> None:
        self.calls.append(("planned", rows, tokens))

    def token(self, row: int) -> None:
        self.calls.append(("token", row))

    def finished(self, row: int, tokens: int, max_tokens: int) -> None:
        self.calls.append(("finished", row, tokens, max_tokens))


def test_a_run_tells_each_token_as_it_comes(tiny_lm: Any) -> None:
    lines = ['{"prompt": "w3 w4", "max_tokens": 3, "seed": 1}', '{"prompt": "w5", "max_tokens": 9, "seed": 2}']
    heard, out = Heard(), []
    settings = BatchSettings(tokens="none", batch_size=2, ignore_eos=True)
    run_batch(LocalEngine(lambda: tiny_lm), list(read_requests(lines)), frozenset(), settings, out.append, heard)
    assert heard.calls[0] == ("planned", 2, 12)
    first_end = next(i for i, call in enumerate(heard.calls) if call[0] == "finished")
    assert {call[1] for call in heard.calls[1:first_end] if call[0] == "token"} == {0, 1}  # both rows wrote first
    assert [call for call in heard.calls if call[0] == "finished"] == [("finished", 0, 3, 3), ("finished", 1, 9, 9)]
    assert sum(call[0] == "token" for call in heard.calls) == 12


def test_the_bar_counts_tokens_and_rows_in_flight() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with TokenProgress(console, "requests", disabled=False) as progress:
        progress.planned(3, 300)
        for _ in range(5):
            progress.token(0)
        progress.token(1)
        task = progress.bar.tasks[0]
        assert task.completed == 6 and task.total == 300
        assert task.fields["rows"] == "0/3 done, 2 in flight" and task.fields["rate"].endswith("tok/s")
        progress.finished(1, 1, 100)  # ended after 1 of its 100: the budget loses the other 99
        assert task.total == 201 and task.fields["rows"] == "1/3 done, 1 in flight"


def test_an_output_file_gets_each_answer_as_it_ends_and_input_order_at_the_end(
    tiny_model_dir: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    """``-o FILE``: the first line is the first request that ended (here the second: the first
    asks three times the tokens), so its answer is there while the rest decode; when the run
    ends the file is in input order. stdout keeps input order throughout."""
    import json

    from click.testing import CliRunner

    from llmsample.batch import resume
    from llmsample.cli import main

    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text('{"custom_id": "long", "prompt": "w3 w4", "max_tokens": 9}\n'
                      '{"custom_id": "short", "prompt": "w5", "max_tokens": 3}\n')  # fmt: skip
    written: list[str] = []
    append = resume.Appender.write
    monkeypatch.setattr(resume.Appender, "write", lambda self, record: (written.append(record["custom_id"]), append(self, record))[1])
    args = ["batch", str(source), "-m", str(tiny_model_dir), "--ignore-eos", "--batch-size", "2", "-q", "--no-log"]
    result = CliRunner().invoke(main, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert written == ["short", "long"]
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["long", "short"]
    piped = CliRunner().invoke(main, args)
    assert [json.loads(line)["custom_id"] for line in piped.stdout.splitlines()] == ["long", "short"]
