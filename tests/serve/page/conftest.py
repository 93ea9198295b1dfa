"""The page's tests run against one server per module, in the system's Chromium."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.serve.conftest import Server, start_server
from tests.serve.page.browser import chromium, markup_model


@pytest.fixture(scope="module")
def page_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    model = markup_model(tmp_path_factory.mktemp("markup"))
    running = start_server(model, tmp_path_factory.mktemp("serve-page") / "stderr", "--batch-size", "4")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if chromium() is None:
        pytest.skip("no chromium (make test installs Debian's where apt is available)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, page_server: Server):
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    response = tab.goto(page_server.url + "/")
    assert response.status == 200
    assert "script-src 'nonce-" in response.headers["content-security-policy"]
    tab.errors = errors
    yield tab
    tab.close()
