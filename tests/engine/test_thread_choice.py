"""llama.cpp's threads per pass, chosen by measuring (:mod:`llmsample.engine.thread_choice`):
on simulated passes and a simulated machine, the count kept follows which one is faster, other
processes starting or ending start a probe at once, and on a quiet machine probes are rare."""

from __future__ import annotations

from collections.abc import Callable

from llmsample.engine import thread_choice
from llmsample.engine.thread_choice import ThreadChoice

Times = Callable[[int], float]


def quiet(threads: int) -> float:  # two cores free: two threads are faster
    return 0.012 if threads == 2 else 0.02


def hogged(threads: int) -> float:  # a busy loop on one of them: every barrier waits
    return 0.08 if threads == 2 else 0.025


class Machine:
    """A clock that passes run forward, and what other processes have used by then (``load``:
    cores' worth, from now on; None: a system without ``/proc/stat``)."""

    def __init__(self, load: float | None = 0.0) -> None:
        self.now, self.used, self.load = 0.0, 0.0, load

    def others(self) -> float | None:
        return None if self.load is None else self.used

    def choice(self, most: int = 2) -> ThreadChoice:
        return ThreadChoice(most, self.others, lambda: self.now)

    def run(self, choice: ThreadChoice, passes: int, seconds: Times, load: float | None = None, width: int = 1) -> list[int]:
        """``passes`` passes taking ``seconds(threads)``; the threads each ran at."""
        if load is not None:
            self.load = load
        used = []
        for _ in range(passes):
            threads = choice.next()
            took = seconds(threads)
            self.now += took
            self.used += took * (self.load or 0.0)
            choice.timed(threads, width, took)
            used.append(threads)
        return used


def test_quiet_keeps_every_core_and_probes_rarely() -> None:
    machine = Machine()
    used = machine.run(machine.choice(), 8000, quiet)
    probes = [i for i, threads in enumerate(used) if threads == 1]
    assert used[-1] == 2 and len(probes) == 5 * thread_choice.PROBE  # after 256, then 512, 1024, 2048, 4096 more
    assert probes[0] == thread_choice.FIRST - 1


def test_a_busy_core_from_the_start_moves_it_to_fewer_threads_within_a_quarter_second() -> None:
    machine = Machine(load=0.6)
    choice = machine.choice()
    used = machine.run(choice, 100, hogged)
    # the load read after a quarter second, the kept count measured under it, then the probe
    assert choice.current == 1 and used.index(1) <= thread_choice.SAMPLE_S / hogged(2) + thread_choice.PROBE + 2
    assert used[10:].count(2) == 0  # and it stays there while the other job runs


def test_another_job_starting_and_ending_moves_it_both_ways() -> None:
    machine = Machine()
    choice = machine.choice()
    machine.run(choice, 200, quiet)
    assert choice.current == 2
    machine.run(choice, 200, hogged, load=0.6)
    assert choice.current == 1
    used = machine.run(choice, 200, quiet, load=0.0)  # it ended: a probe of two threads wins
    # the reading that spans the change may not cross the line: the next one does
    assert choice.current == 2 and used.index(2) <= 2 * thread_choice.SAMPLE_S / quiet(1) + thread_choice.PROBE + 2


def test_without_proc_stat_a_slowdown_starts_the_probe() -> None:
    machine = Machine(load=None)
    choice = machine.choice()
    machine.run(choice, 100, quiet)
    used = machine.run(choice, 100, hogged)
    assert choice.current == 1 and used.index(1) <= thread_choice.PROBE + 1


def test_one_core_never_probes() -> None:
    machine = Machine(load=0.9)
    assert set(machine.run(machine.choice(1), 500, hogged)) == {1}


def test_passes_of_another_width_are_no_measure() -> None:
    """A probe is compared with passes of its own width only (a batch's width changes as rows
    come and go): a probe of four-token passes after one-token passes keeps the count."""
    machine = Machine()
    choice = machine.choice()
    machine.run(choice, thread_choice.FIRST - 1, quiet, width=1)
    machine.run(choice, thread_choice.PROBE, lambda threads: 0.001, width=4)  # the probe, at another width
    assert choice.current == 2
