"""A result in a real Jupyter kernel (nbclient runs the notebook): it displays as the ``--html``
page in a frame, the page the same run gives in this process."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

import llmsample

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")


@pytest.mark.slow
def test_a_result_displays_as_its_page_in_a_kernel(tiny_model_dir: Path) -> None:
    source = (
        "import llmsample\n"
        f"engine = llmsample.Engine(model={str(tiny_model_dir)!r}, backend='transformers')\n"
        "engine.generate('w3 w4', raw=True, seed=2, max_tokens=6)"
    )
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3").execute()
    (data,) = [output["data"] for output in notebook.cells[0].outputs if output["output_type"] == "execute_result"]
    frame = data["text/html"]
    assert frame.startswith('<iframe srcdoc="') and "Result(" in data["text/plain"]
    page = html.unescape(frame.split('srcdoc="', 1)[1].split('"', 1)[0])
    here = llmsample.Engine(model=str(tiny_model_dir), backend="transformers").generate("w3 w4", raw=True, seed=2,
                                                                                        max_tokens=6)  # fmt: skip
    after_meta = lambda text: text.split('<p class="meta">')[1].split("</p>", 1)[1]  # noqa: E731  (timings)
    assert after_meta(page) == after_meta(here.html()) and html.escape(here.text.split()[0]) in page
