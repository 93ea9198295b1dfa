"""A real server in a subprocess on a free loopback port, on a tiny random model with a chat
template, talked to as its clients do (the ``openai`` package, plain HTTP)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_HOME, make_tiny_model, with_chat_template

TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
HERMES = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}Tools: {% for tool in tools %}{{ tool.function.name }} {% endfor %}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif not (m.role == 'system' and tools) %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}<|im_start|>assistant
"""
"""A Hermes/Qwen chat template that renders tools (``<tool_call>`` calls, ``<tool_response>`` results)."""
NO_EOS = {"1": -100}  # logit_bias: the tiny model's <eos> never comes (long answers on demand)


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen
    log: Path

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def client(self, api_key: str = "none", **kwargs: object):
        import openai

        return openai.OpenAI(base_url=self.base, api_key=api_key, max_retries=0, timeout=60, **kwargs)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def serve_process(model_dir: Path, err: Any, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``llmsample serve`` on port 0 (the kernel picks a free one), its stderr to ``err``."""
    environment = {**os.environ, "LLMSAMPLE_HOME": str(TEST_HOME), "HF_HUB_OFFLINE": "1"}
    environment.pop("LLMSAMPLE_API_KEY", None)
    environment.update(env or {})
    dtype = [] if "llama.cpp" in args else ["--dtype", "float32"]  # llama.cpp runs the GGUF's own
    command = [sys.executable, "-m", "llmsample", "serve", "-m", str(model_dir), "--host", "127.0.0.1",
               "--port", "0", "--device", "cpu", *dtype, *args]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL, env=environment)


def start_server(model_dir: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    """A server logging to ``log``, ready once it says where it listens."""
    with open(log, "wb") as err:
        proc = serve_process(model_dir, err, *args, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", log.read_text(errors="replace"))
        if found:
            return Server(found.group(1), proc, log)
        if proc.poll() is not None:
            pytest.fail(f"the server exited {proc.returncode}: {log.read_text(errors='replace')}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the server did not start in time")


def wait_in_flight(server: Server, count: int) -> None:
    """Until the server holds ``count`` requests (running or queued)."""
    import httpx

    deadline = time.monotonic() + 30
    while httpx.get(server.url + "/health").json()["in_flight"] != count:
        assert time.monotonic() < deadline, "in_flight never reached the count"
        time.sleep(0.05)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_chat_template(make_tiny_model(tmp_path_factory.mktemp("tiny-chat")), TEMPLATE)


@pytest.fixture(scope="session")
def server(chat_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server: four rows, the default preset."""
    running = start_server(chat_model_dir, tmp_path_factory.mktemp("serve") / "stderr", "--batch-size", "4")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def model_id(chat_model_dir: Path) -> str:
    return str(chat_model_dir)


def start_byte_chat_server(
    tmp_path_factory: pytest.TempPathFactory, name: str, *args: str, template: str = TEMPLATE
) -> Server:
    """A byte-level model (it can spell any text, JSON included) with a chat template, served."""
    from tests.constraints.conftest import make_byte_model

    path = with_chat_template(make_byte_model(tmp_path_factory.mktemp(f"byte-{name}")), template)
    return start_server(path, tmp_path_factory.mktemp(name) / "stderr", *args)


@pytest.fixture(scope="session")
def tools_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The byte model with the Hermes template, 64 rows: every API's tool tests share it."""
    running = start_byte_chat_server(tmp_path_factory, "tools", "--batch-size", "64", template=HERMES)
    yield running
    running.stop()
