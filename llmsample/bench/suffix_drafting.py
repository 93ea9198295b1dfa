"""``bench --suffix``: ``--draft suffix`` (one pool across requests) against the same batch
without drafting, on three workloads through the batch path (``decode_batch``, the loop ``batch``
and ``serve`` run), side by side in rotating rounds (:mod:`llmsample.bench.timing`), ratios of
rounds, each workload one request at a time and four at once (:data:`ROWS`). Each round of the
drafting side starts from an empty pool, as a fresh run does.

- **The same JSON shape**: 16 requests for a person's record as JSON, greedy (at most 96 tokens): the
  drafter's case (each answer drafts the keys, quoting and layout of the next ones'); the
  issue's bar is 1.5x plain.
- **Edits of the same code**: 8 requests to give back the same functions (in four orders, each
  with two comments) with a comment line added, greedy (at most 160 tokens): an answer copies
  its prompt and the answers before it; the bar is 1.5x.
- **Open chat**: 16 chat prompts, sampled, every request its own seed and its own length (from
  two thirds to four thirds of ``--tokens``, at most 48: 32 to 64 tokens, EOS ignored): little
  repeats, so this is what looking up and verifying rejected drafts costs; the bar is 0.95x.
  Real answers end out of step; with one length for all, plain rows would run in lockstep, four
  prefills at once, which no real traffic does, and one kept draft would put the drafting side
  out of step (docs/history/2026-12.md, 2026-12-05)."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from llmsample.bench.prompts import batch_prompts, rewrite_prompts
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.suffix_pool import suffix_drafter
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig

RECORDS = 16
EDITS = 8
CHATS = 16
ROWS = (1, 4)
"""Each workload at these batch sizes: one request at a time, as an agent sends them (where a CPU
has room to verify a draft), and four at once, as a server's batch holds them."""
RECORD_CAP = 96
"""Tokens a record may take: the default model's record reaches its "email" key in about 50 and
often never ends (an email of "john-john-..."), so a cap keeps the workload's size known:
16 x 96 + 8 x 160 + 758 tokens a side and batch size."""
EDIT_CAP = 160
"""Tokens an edit may take (its answer, the whole file, runs longer)."""

PEOPLE = [
    ("Maria Lopez", "nurse", "Madrid"), ("Tom Becker", "baker", "Berlin"), ("Aiko Sato", "pilot", "Osaka"),
    ("Liam Walsh", "teacher", "Dublin"), ("Nora Berg", "architect", "Oslo"), ("Omar Haddad", "chef", "Cairo"),
    ("Elena Rossi", "lawyer", "Milan"), ("Ravi Menon", "engineer", "Pune"),
]  # fmt: skip


def chat_length(i: int, tokens: int) -> int:
    """Request ``i``'s answer length: spread over two thirds to four thirds of ``tokens``."""
    third = tokens // 3
    return tokens - third + (7 * i) % (2 * third + 1)


def record_prompts(count: int) -> list[str]:
    """Requests for the same JSON shape, each about its own person (names, jobs and cities mixed)."""
    prompts = []
    for i in range(count):
        name, job, city = (PEOPLE[(i // step) % len(PEOPLE)][field] for field, step in ((0, 1), (1, 2), (2, 4)))
        prompts.append(
            f'Write the record of {name}, a {job} from {city}, as JSON with the keys "name", "job", "city", "age", '
            '"email" and "skills" (a list of three). Only the JSON.'
        )
    return prompts


@dataclass(frozen=True)
class SuffixRow:
    workload: str
    tok_s: float
    plain_tok_s: float
    ratio: float
    acceptance_rate: float  # accepted over drafted, the last round's
    tokens_per_pass: float  # new tokens per target pass, the last round's
    bar: float  # the ratio the issue asks for


@dataclass
class Side:
    """One side of a workload: a batch run's tokens/s; ``counts``: its last run's new tokens and
    (drafting) drafted and accepted tokens and target passes."""

    lm: LoadedModel
    items: Callable[[], list[BatchItem]]
    ignore_eos: bool
    rows: int
    counts: Counter[str] = field(default_factory=Counter)

    def __call__(self) -> float:
        start = time.perf_counter()
        self.counts.clear()
        for _, record in decode_batch(self.lm, self.items(), self.rows, ignore_eos=self.ignore_eos):
            if isinstance(record, TokenEvent):
                self.counts["tokens"] += 1
            elif isinstance(record, Summary) and record.facts.speculation is not None:
                drafts = record.facts.speculation
                self.counts.update(drafted=drafts.drafted, accepted=drafts.accepted, passes=drafts.target_passes)
        return self.counts["tokens"] / (time.perf_counter() - start)


def _items(lm: LoadedModel, prompts: list[list[int]], cfg: Callable[[int], SamplingConfig], suffix: bool):
    """A maker of the requests, with a fresh pool shared by their drafters (``suffix``: as
    ``--draft suffix`` makes them) or none."""

    def make() -> list[BatchItem]:
        drafter = suffix_drafter(lm)
        return [
            BatchItem(i, ids, cfg(i), RunStats(lm.name, "bench", cfg(i).seed), drafter if suffix else None)
            for i, ids in enumerate(prompts)
        ]

    return make


def run_suffix_benchmark(
    lm: LoadedModel, runs: int = 3, tokens: int = 64, log: Callable[[str], None] = lambda step: None
) -> list[SuffixRow]:
    """Every workload, each drafting side against its plain side in ``runs`` rounds."""
    records = [encode_prompt(lm, p)[0].tolist() for p in record_prompts(RECORDS)]
    edits = [encode_prompt(lm, p)[0].tolist() for p in rewrite_prompts(EDITS)]
    chats = [encode_prompt(lm, p)[0].tolist() for p in batch_prompts(CHATS)]
    greedy = SamplingConfig(temperature=0.0, max_tokens=RECORD_CAP, seed=0)
    editing = SamplingConfig(temperature=0.0, max_tokens=EDIT_CAP, seed=0)

    def sampled(i: int) -> SamplingConfig:
        return SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=chat_length(i, tokens), seed=1000 + i)

    workloads = [
        (f"{RECORDS} records of one JSON shape, greedy (batch {size})", records, lambda i: greedy, False, 1.5, size)
        for size in ROWS
    ] + [
        (f"{EDITS} edits of the same code, greedy (batch {size})", edits, lambda i: editing, False, 1.5, size)
        for size in ROWS
    ] + [
        (f"{CHATS} open chat prompts of varied lengths, sampled (batch {size})", chats, sampled, True, 0.95, size)
        for size in ROWS
    ]
    rows = []
    for name, prompts, cfg, ignore_eos, bar, size in workloads:
        log(f"--draft suffix against no drafting: {name}")
        drafting = Side(lm, _items(lm, prompts, cfg, True), ignore_eos, size)
        plain = Side(lm, _items(lm, prompts, cfg, False), ignore_eos, size)
        mine, theirs = rounds(runs, [drafting, plain])
        last = drafting.counts
        rate = last["accepted"] / last["drafted"] if last["drafted"] else 0.0
        per_pass = last["tokens"] / last["passes"] if last["passes"] else 0.0
        ratio = paired_ratio(mine, theirs)
        rows.append(SuffixRow(name, statistics.median(mine), statistics.median(theirs), ratio, rate, per_pass, bar))
    return rows


def rows_to_dict(rows: list[SuffixRow]) -> list[dict[str, Any]]:
    """The rows as the JSON file's ``rows``."""
    return [asdict(row) for row in rows]
