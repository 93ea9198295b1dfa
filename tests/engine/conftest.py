"""Fixtures the engine's llama.cpp tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["unified", "streams"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both of llama.cpp's cache layouts for several rows: one unified cache, or a stream per row
    (made from two rows on, here, rather than from ``STREAMS_ROWS``)."""
    monkeypatch.setattr("llmsample.engine.llamacpp_batch.STREAMS_ROWS", 1 << 20 if request.param == "unified" else 2)
    return request.param
