"""A batch run over several processes (``torchrun``, ``accelerate launch``; one machine or many):
each rank decodes its share of the requests into its own part file, and rank 0 merges the parts
into the output, in input order, once every rank is done.

Part files sit next to the output (``OUT.part-R-of-N``) and resume like the output itself: a
rerun skips what any part or the output already holds, so a killed rank loses only the requests
it had in flight, whatever the number of ranks the rerun uses."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsample.batch.requests import Request, RequestError
from llmsample.batch.resume import Appender, OutputFormat, prepare_resume


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: rank 0 of 1 when it runs alone."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_ranks() -> Ranks:
    """What torchrun (or accelerate launch) told this process, without starting anything."""
    return Ranks(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def part_path(output: Path, ranks: Ranks) -> Path:
    return output.with_name(f"{output.name}.part-{ranks.rank}-of-{ranks.world}")


def existing_parts(output: Path) -> list[Path]:
    """Every part file of this output, from this run's ranks or an earlier run's."""
    return sorted(output.parent.glob(f"{output.name}.part-*-of-*"))


def finished_everywhere(output: Path, fmt: OutputFormat) -> frozenset[str]:
    """The custom_ids the output or any part already holds (each file repaired if torn)."""
    done = prepare_resume(output, fmt).done
    for part in existing_parts(output):
        done |= prepare_resume(part, fmt).done
    return done


def my_share(parsed: list[Request | RequestError], ranks: Ranks) -> list[Request | RequestError]:
    """Every ``world``-th line from ``rank`` on: shares of equal size and similar lengths, and
    the same split on every rerun with the same number of ranks."""
    return parsed[ranks.rank :: ranks.world]


def merge_parts(output: Path, parsed: list[Request | RequestError], resume: OutputFormat | None = None) -> int:
    """Append every part's records to the output in input order, then remove the parts; with
    ``resume``, parts an earlier run left are repaired first (torn lines cut, errors dropped to
    be retried). Returns how many records were merged."""
    order = {item.custom_id: item.line for item in parsed if item.custom_id is not None}
    records: list[tuple[int, str]] = []
    parts = existing_parts(output)
    if resume is not None:
        prepare_resume(output, resume)
    for part in parts:
        if resume is not None:
            prepare_resume(part, resume)
        for line in part.read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.append((_position(json.loads(line), order), line))
    records.sort(key=lambda pair: pair[0])
    with Appender(output) as appender:
        for _, line in records:
            appender.write(json.loads(line))
    for part in parts:
        part.unlink()
    return len(records)


def _position(record: dict[str, Any], order: dict[str, int]) -> int:
    """The input line of a record's request: by custom_id, else (a line that had none) the line
    number ours carries and OpenAI's error message starts with."""
    if record.get("custom_id") in order:
        return order[record["custom_id"]]
    if isinstance(record.get("line"), int):
        return record["line"]
    message = (record.get("error") or {}).get("message", "")
    number = message.removeprefix("line ").split(":", 1)[0]
    return int(number) if number.isdigit() else len(order) + 1
