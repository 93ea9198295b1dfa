"""llama.cpp's threads per pass, chosen by measuring (:mod:`llmsample.engine.thread_choice`):
on simulated pass times, the count kept follows which one is faster, the probes thin out on a
quiet machine, and a slowdown starts one at once."""

from __future__ import annotations

from collections.abc import Callable

from llmsample.engine import thread_choice
from llmsample.engine.thread_choice import ThreadChoice


def run(choice: ThreadChoice, passes: int, seconds: Callable[[int, int], float], width: int = 1) -> list[int]:
    """``passes`` passes whose time at ``threads`` (pass ``i``) is ``seconds(threads, i)``; the
    threads each ran at."""
    used = []
    for i in range(passes):
        threads = choice.next()
        choice.timed(threads, width, seconds(threads, i))
        used.append(threads)
    return used


def quiet(threads: int, i: int) -> float:  # two cores free: two threads are faster
    return 0.012 if threads == 2 else 0.02


def hogged(threads: int, i: int) -> float:  # a busy loop on one of them: every barrier waits
    return 0.08 if threads == 2 else 0.025


def test_quiet_keeps_every_core_and_probes_less_and_less() -> None:
    used = run(ThreadChoice(2), 4000, quiet)
    probes = [i for i, threads in enumerate(used) if threads == 1]
    assert used[-1] == 2 and len(probes) <= 8 * thread_choice.PROBE  # 64, 128, 256, ..., 1024 apart
    assert probes[0] == thread_choice.FIRST - 1 and probes[-1] - probes[-2 * thread_choice.PROBE] > 1000


def test_a_busy_core_moves_it_to_fewer_threads_and_back_when_it_goes() -> None:
    choice = ThreadChoice(2)
    run(choice, 200, quiet)
    assert choice.current == 2
    used = run(choice, 400, hogged)  # another job starts: the slowdown probes at once
    assert choice.current == 1 and used.index(1) <= thread_choice.PROBE + 1
    assert used[thread_choice.PROBE * 2 :].count(2) <= 3 * thread_choice.PROBE  # later probes of two
    run(choice, 3000, quiet)  # it stopped: a probe of two threads wins again
    assert choice.current == 2


def test_one_core_never_probes() -> None:
    assert set(run(ThreadChoice(1), 500, lambda threads, i: 0.01)) == {1}


def test_passes_of_another_width_are_no_measure() -> None:
    """A probe is compared with passes of its own width only (a batch's width changes as rows
    come and go): a probe of four-token passes after one-token passes keeps the count."""
    choice = ThreadChoice(2)
    run(choice, thread_choice.FIRST - 1, quiet, width=1)
    run(choice, thread_choice.PROBE, lambda threads, i: 0.001, width=4)  # the probe, at another width
    assert choice.current == 2
