"""A step's big temporaries stay in the heap: made again the next step, they fault in no pages."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import resource, torch
    from llmsample.models.allocator import keep_freed_blocks
    from llmsample.sampling.config import SamplingConfig
    from llmsample.sampling.figures import step_figures
    from llmsample.sampling.history import TokenHistory
    from llmsample.sampling.pipeline import sampler_chain

    kept = keep_freed_blocks()
    logits = torch.randn(16, 49152)
    cfg = SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, max_tokens=8, seed=0)
    generators = [torch.Generator().manual_seed(i) for i in range(16)]
    history = TokenHistory.for_config(torch.zeros(16, 4, dtype=torch.long), 49152, cfg)

    def step():
        chain = sampler_chain(logits, history, cfg)
        step_figures(chain, chain.draw(generators), 5)

    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def faults(**env: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    kept, count = done.stdout.split()
    return kept, int(count)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's thresholds")
def test_freed_blocks_are_reused_unless_the_user_set_the_thresholds() -> None:
    kept, count = faults()
    # 20 sampled steps of 16 rows: the heap's top may still grow by a [16, 49k] block (768 pages)
    # a few times, where glibc's own thresholds fault ~6,500 pages in every step
    assert kept == "True" and count < 5 * 1536
    kept, count = faults(MALLOC_TRIM_THRESHOLD_="131072")  # the user's choice stands
    # glibc's own: every step faults its blocks in (~1,000 pages a step since the temperature and
    # top-k run on the candidates; ~1,500 before)
    assert kept == "False" and count > 10 * 1536


@pytest.mark.parametrize(
    "env",
    [{"MALLOC_MMAP_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}],
)
def test_thresholds_the_user_set_are_kept(env: dict[str, str]) -> None:
    code = "from llmsample.models.allocator import keep_freed_blocks; print(keep_freed_blocks())"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert done.stdout.split() == ["False"]


TRIMMED = textwrap.dedent(
    """
    import torch
    from llmsample.models.allocator import keep_freed_blocks, return_freed_memory

    def resident_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    assert keep_freed_blocks()
    blocks = [torch.ones(1 << 20) for _ in range(48)]  # 48 blocks of 4 MiB from the heap, touched
    loaded = resident_mb()
    del blocks
    kept = resident_mb()  # freed below the raised trim threshold: still resident
    return_freed_memory()
    print(loaded - kept, kept - resident_mb())
    """
)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc_trim")
def test_memory_a_load_freed_goes_back_to_the_kernel() -> None:
    """What the raised thresholds keep for a step's temporaries, a load that replaced its weights
    hands back: 192 MiB freed stay resident until the trim, and leave with it."""
    done = subprocess.run([sys.executable, "-c", TRIMMED], capture_output=True, text=True, check=True)
    kept_back, released = (float(x) for x in done.stdout.split())
    assert kept_back < 32 and released > 150
