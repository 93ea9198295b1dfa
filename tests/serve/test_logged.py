"""Every request a server answers is a run in the run log (command ``serve``), whole or streamed,
from several clients at once; ``--no-log`` keeps them out."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llmsample.logs import store
from tests.serve.conftest import NO_EOS, start_server


def test_served_requests_are_logged_whole_or_streamed(chat_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(chat_model_dir, tmp_path / "stderr", "--batch-size", "4")
    try:
        client, model = server.client(), str(chat_model_dir)
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "w7 w8"}],
                                              max_tokens=4, seed=3, logit_bias=NO_EOS)  # fmt: skip
        chunks = list(client.completions.create(model=model, prompt="w9", max_tokens=3, seed=4, stream=True,
                                                logit_bias=NO_EOS))  # fmt: skip
        with ThreadPoolExecutor(4) as pool:  # several rows end in the same steps: one writer keeps them all
            answers = list(pool.map(lambda n: client.completions.create(model=model, prompt=f"w{n}", max_tokens=2,
                                                                        seed=n, logit_bias=NO_EOS), range(10, 14)))  # fmt: skip
    finally:
        assert server.stop() == 0
    kept = store.recent(20)[::-1]
    assert [run.command for run in kept] == ["serve"] * 6
    first, second, *together = kept
    assert (first.prompt, first.seed, first.text) == ('[{"role": "user", "content": "w7 w8"}]', 3,
                                                      chat.choices[0].message.content)  # fmt: skip
    assert (second.prompt, second.seed, second.tokens) == ("w9", 4, 3)
    assert second.text == "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert len(first.records) == 4 and first.settings["max_tokens"] == 4
    assert sorted((run.prompt, run.text) for run in together) == sorted(
        (f"w{n}", answer.choices[0].text) for n, answer in zip(range(10, 14), answers, strict=True)
    )


def test_no_log_keeps_a_server_out_of_the_log(chat_model_dir: Path, tmp_path: Path) -> None:
    server = start_server(chat_model_dir, tmp_path / "stderr", "--no-log")
    try:
        server.client().completions.create(model=str(chat_model_dir), prompt="w9", max_tokens=2)
    finally:
        assert server.stop() == 0
    assert store.recent(5) == []
