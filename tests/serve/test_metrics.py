"""``/metrics``: Prometheus' text format, read back by ``prometheus_client``'s own parser, with
figures that move as the requests the test sends say they must."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llmsample.events import CacheReuse, RunFacts, Speculation, Summary
from llmsample.serve.prometheus import Histogram, ServeMetrics
from tests.serve.conftest import NO_EOS, Server


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by name and labels, as Prometheus would read them."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_a_histogram_counts_cumulatively_with_a_value_on_a_bound_in_that_bucket() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    assert histogram.lines("h") == [
        'h_bucket{le="0.1"} 2', 'h_bucket{le="1.0"} 3', 'h_bucket{le="+Inf"} 4', "h_sum 3.65", "h_count 4"
    ]  # fmt: skip


def test_the_text_parses_and_carries_every_family() -> None:
    metrics = ServeMetrics()
    metrics.answered(200)
    metrics.answered(200)
    metrics.answered(503)
    metrics.forward_pass(0.003)
    facts = RunFacts(cache=CacheReuse(reused=7, prefilled=3), speculation=Speculation(10, 6, 4, 2.0))
    summary = Summary("ab", 2, 10, "length", 0.2, 5.0, "m", "default", 1, 0.5, facts)
    metrics.row_ended("finished", summary)
    metrics.row_ended("failed", None)
    read = samples(metrics.render(running=3, queued=2))
    assert read["llmsample_http_requests_total", (("status", "200"),)] == 2
    assert read["llmsample_http_requests_total", (("status", "503"),)] == 1
    assert read["llmsample_rows_total", (("outcome", "failed"),)] == 1
    assert read["llmsample_prompt_tokens_total", ()] == 10
    assert read["llmsample_completion_tokens_total", ()] == 2
    assert read["llmsample_rows_running", ()] == 3
    assert read["llmsample_rows_queued", ()] == 2
    assert read["llmsample_prompt_cache_hits_total", ()] == 1
    assert read["llmsample_prompt_cache_tokens_saved_total", ()] == 7
    assert read["llmsample_draft_tokens_total", ()] == 10
    assert read["llmsample_draft_tokens_accepted_total", ()] == 6
    assert read["llmsample_time_to_first_token_seconds_bucket", (("le", "0.25"),)] == 1
    assert read["llmsample_time_to_first_token_seconds_bucket", (("le", "0.1"),)] == 0
    assert read["llmsample_forward_pass_seconds_count", ()] == 1


def test_a_served_request_moves_the_counters(server: Server, model_id: str) -> None:
    before = samples(httpx.get(server.url + "/metrics").text)
    reply = server.client().completions.create(
        model=model_id, prompt="w3 w4", max_tokens=5, n=2, seed=3, logit_bias=NO_EOS
    )
    response = httpx.get(server.url + "/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = samples(response.text)

    def grew(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[name, labels] - before.get((name, labels), 0)

    assert grew("llmsample_completion_tokens_total") == reply.usage.completion_tokens == 10
    assert grew("llmsample_prompt_tokens_total") == 2 * reply.usage.prompt_tokens  # each row's prompt
    assert grew("llmsample_rows_total", (("outcome", "finished"),)) == 2
    assert grew("llmsample_http_requests_total", (("status", "200"),)) == 2  # the completion and /metrics before
    assert grew("llmsample_time_to_first_token_seconds_count") == 2
    assert grew("llmsample_forward_pass_seconds_count") >= 5  # a prefill and a step per token at least
    assert after["llmsample_rows_running", ()] == 0
