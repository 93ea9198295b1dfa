"""A batch run over several processes (``torchrun``, ``accelerate launch``; one machine or many):
each rank decodes its share of the requests into its own part file, and rank 0 merges the parts
into the output, in input order, once every rank is done.

Part files sit next to the output (``OUT.part-R-of-N``) and resume like the output itself: a
rerun skips what any part or the output already holds, so a killed rank loses only the requests
it had in flight, whatever the number of ranks the rerun uses. Rank 0 holds the output's lock
for the whole run and does every merge (``llmsample.batch.output.consolidate``): before the
ranks start, what a killed run left; at the end, this run's parts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llmsample.batch.output import existing_parts
from llmsample.batch.requests import Request, RequestError
from llmsample.errors import UserError

__all__ = ["Ranks", "existing_parts", "launched_ranks", "my_share", "part_path"]


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: rank 0 of 1 when it runs alone."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_ranks() -> Ranks:
    """What torchrun (or accelerate launch) told this process, without starting anything.
    ``WORLD_SIZE`` above 1 without the rendezvous address a launcher sets is refused: the
    process would wait for ranks nobody started, or fail deep inside torch."""
    try:
        ranks = Ranks(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError:
        raise UserError(
            f"RANK={os.environ.get('RANK')!r} and WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} must be whole "
            "numbers; they are set by torchrun (unset them to run in one process)"
        ) from None
    if ranks.world > 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        raise UserError(
            f"WORLD_SIZE={ranks.world} is set, but this process was not launched by torchrun (no MASTER_ADDR "
            f"and MASTER_PORT): run `torchrun --nproc-per-node {ranks.world} -m llmsample batch ...`, "
            "or unset WORLD_SIZE and RANK to run in one process"
        )
    if not 0 <= ranks.rank < ranks.world:
        raise UserError(f"RANK={ranks.rank} is not below WORLD_SIZE={ranks.world}; launch with torchrun")
    return ranks


def part_path(output: Path, ranks: Ranks) -> Path:
    return output.with_name(f"{output.name}.part-{ranks.rank}-of-{ranks.world}")


def my_share(parsed: list[Request | RequestError], ranks: Ranks) -> list[Request | RequestError]:
    """Every ``world``-th line from ``rank`` on: shares of equal size and similar lengths, and
    the same split on every rerun with the same number of ranks."""
    return parsed[ranks.rank :: ranks.world]
