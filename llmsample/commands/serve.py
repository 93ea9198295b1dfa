"""``llmsample serve``: an OpenAI-compatible HTTP server on the one decoding loop."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from llmsample.commands.help import GroupedCommand
from llmsample.commands.model_options import load_model_with_progress, model_options
from llmsample.commands.options import (
    deterministic_option,
    draft_options,
    keeps_log,
    log_option,
    prompt_cache_option,
    quiet_option,
    reference_option,
)
from llmsample.commands.sampling_options import resolve_sampling, sampling_options, sampling_overrides
from llmsample.errors import UserError


@click.command(cls=GroupedCommand)
@model_options
@sampling_options
@draft_options
@deterministic_option()
@reference_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0 picks a free port.")
@click.option(
    "--api-key",
    metavar="KEY",
    envvar="LLMSAMPLE_API_KEY",
    help="Require Authorization: Bearer KEY [env: LLMSAMPLE_API_KEY].",
)
@click.option("--batch-size", type=click.IntRange(1, 1024), help="Rows decoded together [default: by memory].")
@click.option(
    "--max-model-len",
    type=click.IntRange(2),
    metavar="TOKENS",
    help="The longest prompt and answer a request may take [default: the model's context]. Shorter, each row "
    "keeps a smaller cache, and on llama.cpp wide batches step faster.",
)
@click.option(
    "--max-queue",
    type=click.IntRange(0, 100000),
    default=256,
    show_default=True,
    help="Rows that may wait for a free one; a request of more rows than the free ones and these gets 503 (an idle server takes any).",
)
@click.option(
    "--read-timeout",
    type=click.FloatRange(0, min_open=True),
    default=30,
    show_default=True,
    metavar="SECONDS",
    help="Time a client has to send a request's headers, and again its body, before the server hangs up.",
)
@prompt_cache_option
@click.option("--system", metavar="TEXT", help="System message for prompts without one.")
@click.option(
    "--strict-api",
    is_flag=True,
    help="Refuse (400) any request key the server would otherwise ignore with a warning (unknown keys, hints).",
)
@click.option("--engine", is_flag=True, hidden=True, help="Serve as this user's warm engine (llmsample start).")
@click.option("--keep-alive", type=click.FloatRange(0, min_open=True), hidden=True, help="An engine's idle seconds.")
@log_option
@quiet_option("startup line or request log")
def serve(**options: Any) -> None:
    """Serve the model over the OpenAI (chat, completions, responses) and Anthropic (messages) APIs,
    streamed or whole, tool calls included, with a page to try it at /.

    Every request in flight is a row of one continuous batch; each request may carry any
    llmsample sampling key beside OpenAI's (top_k, min_p, dry_multiplier, preset, ...). The
    sampling flags here are the server's defaults.

    \b
    llmsample serve --port 8000
    llmsample serve -m HuggingFaceTB/SmolLM2-360M-Instruct --preset creative --batch-size 16
    LLMSAMPLE_API_KEY=secret llmsample serve --host 0.0.0.0

    Every answered request is kept in the run log (`llmsample logs`) unless --no-log.
    """
    from llmsample.batch.run import BatchSettings
    from llmsample.engine.continuous_batch import default_batch_size
    from llmsample.sampling import presets as preset_store
    from llmsample.serve.access import AccessLog
    from llmsample.serve.app import create_app
    from llmsample.serve.engine import Engine
    from llmsample.serve.job_endpoint import Idle, add_routes
    from llmsample.serve.server import bind, exposure_warning, serve_forever
    from llmsample.serve.state import ServeState

    if options["compile_model"]:
        raise UserError(
            "--compile decodes rows of one prompt in lockstep; a server's requests have their own prompts: leave it out"
        )
    resolve_sampling(options)  # bad flags and an unknown preset fail before the model loads
    warning = exposure_warning(options["host"], options["api_key"])
    if warning:
        click.echo(warning, err=True)
    if options["engine"]:
        from llmsample.client import registry
        from llmsample.serve.job_endpoint import bind_unix

        directory = registry.runtime_dir()
        sock_path = registry.socket_path(directory, registry.engine_id(registry.spec_of(options)))
        sock = bind_unix(sock_path)
    else:
        sock = bind(options["host"], options["port"])
    overrides = {key: value for key, value in sampling_overrides(options).items() if value is not None}
    settings = BatchSettings(preset=options["preset"], preset_file=options["preset_file"], overrides=overrides,
                             system=options["system"], draft_tokens=options["draft_tokens"])  # fmt: skip
    lm = load_model_with_progress(options)
    limit_context(lm, options["max_model_len"])
    if lm.tensor_parallel:
        raise UserError("--tp serves rows of one prompt in lockstep; run one server per GPU instead")
    from llmsample.commands.model_options import build_drafter
    from llmsample.jobs import Capabilities, drafter_asked, engine_drafter

    auto = build_drafter({**options, "draft": "auto"}, lm)  # a job asking auto (the commands' default)
    drafter = auto  # every request's, by --draft: auto (the default, the same pool), none, or another
    if options["draft"] == "none":
        drafter = None
    elif drafter_asked(options["draft"]):
        drafter = build_drafter(options, lm)
    reference = None
    if options["reference"]:
        from llmsample.commands.model_options import load_reference

        reference = load_reference(options, lm)
    batch_size = options["batch_size"] or default_batch_size(lm, min(lm.context_length or 2048, 4096))
    engine = Engine(lm, batch_size, options["max_queue"], prompt_cache_mb=options["prompt_cache_mb"],
                    deterministic=bool(options["deterministic"]), reference=reference)
    if not options["engine"] and keeps_log(options):  # a warm engine's clients log their own runs
        from llmsample.serve.journal import ServeLog

        engine.log = ServeLog(options["system"])
    state = ServeState(lm, engine, settings, options["api_key"] or None, presets=frozenset(preset_store.discover()),
                       drafter=drafter, auto=auto, read_timeout=options["read_timeout"],
                       strict_api=options["strict_api"],
                       capabilities=Capabilities(engine_drafter(options["draft"]), reference is not None))  # fmt: skip
    idle = Idle(state)
    if options["engine"]:
        ready = engine_ready(options, state, idle, directory, sock_path)
    else:
        ready = tcp_ready(options, sock, lm.name, batch_size)
    try:
        app = create_app(state)
        add_routes(app, state, idle)
        serve_forever(app if options["quiet"] else AccessLog(app), sock, engine, ready, options["read_timeout"])
    finally:
        sock.close()
        if engine.log is not None:
            engine.log.close()
        if options["engine"]:
            registry.remove_record(directory, registry.engine_id(registry.spec_of(options)), os.getpid())


def limit_context(lm: Any, tokens: int | None) -> None:
    """``--max-model-len``: every request's positions at most ``tokens`` (what the server checks
    requests against, reports as ``max_model_len`` and sizes each row's cache for)."""
    if tokens is None:
        return
    if lm.context_length and tokens > lm.context_length:
        raise UserError(f"--max-model-len {tokens} is beyond the model's context of {lm.context_length}; "
                        f"give at most {lm.context_length}")  # fmt: skip
    lm.context_limit = tokens


def tcp_ready(options: dict[str, Any], sock: Any, name: str, batch_size: int) -> Callable[[], None]:
    """Once a signal stops the server cleanly: whoever waits for this line may stop it."""
    host, port = sock.getsockname()[:2]

    def ready() -> None:
        if not options["quiet"]:
            shown = f"[{host}]" if ":" in host else host
            base = f"http://{shown}:{port}"
            click.echo(f"llmsample serve: {name} on {base}/v1 (batch size {batch_size}) · page {base}/", err=True)
        sys.stderr.flush()

    return ready


def engine_ready(options: dict[str, Any], state: Any, idle: Any, directory: Any, sock_path: Any) -> Callable[[], None]:
    """A warm engine is ready once its record is written (``llmsample start`` waits for it); from
    then on its keep-alive counts."""
    from llmsample.serve.job_endpoint import keep_alive, register

    def ready() -> None:
        register(directory, options, state, sock_path, options["keep_alive"])
        if options["keep_alive"]:
            keep_alive(idle, options["keep_alive"])

    return ready
