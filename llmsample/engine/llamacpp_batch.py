"""The llama.cpp backend behind the engine's seam (:mod:`llmsample.engine.backend`): each row is
a llama.cpp sequence of one unified KV cache, or from :data:`STREAMS_ROWS` rows of a stream of
its own, and every call is one ``llama_batch`` of
``(token, position, sequence, wants logits)`` entries: ``admit`` a prompt per new sequence id
with logits at its last token, ``step`` a token per row, ``verify`` each row's ragged tokens
with logits at every one, ``rollback`` and ``keep`` are ``seq_rm``, ``admit_copies`` is
``seq_cp`` (the copies share the prompt's cells); the prompt cache's ``save`` copies a row's
sequence state to host memory and ``admit_saved`` writes it into a new row's sequence. Kept
prefixes never hold cells of the context: every row's attention spans every cell in use up to
the highest, so kept rows in the unified cache slowed every pass (4 streaming clients on a
server: 0.77x llama-server's tokens a second with them, 1.17x in host memory,
docs/history/2026-12.md). Logits go from llama.cpp's output buffer into
the float32 tensor the chain reads in one copy (a view would be overwritten by the next decode,
and a joining row's prefill runs before the chain has read the last step's logits)."""

from __future__ import annotations

import ctypes
import itertools
import time
from collections.abc import Callable, Collection, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from llmsample.engine.llamacpp_kept import HostSequence
from llmsample.engine.thread_choice import ThreadChoice
from llmsample.errors import NoRoom, RuntimeFailure
from llmsample.models.llamacpp_model import LlamaCppModel

Entry = tuple[int, int, int, bool]
"""A ``llama_batch`` entry: token, position, sequence id, whether its logits are wanted."""
BATCH = 512  # tokens per llama_decode call (a longer prefill is fed in several)
STREAMS_ROWS, STREAMS_COST = 8, 2
"""A cache of one stream per row is made for at least ``STREAMS_ROWS`` rows, where it takes at
most ``STREAMS_COST`` times the unified cache's cells (each stream holds the longest row; the
unified cache holds twice the rows' positions): its rows attend over their own cells alone, and
not over the others'. Steps of 80-token rows, the default model on 2 cores
(``experiments/stream_steps.py``): 16 rows 62 ms against 92 unified, 8 rows 34 against 37, 4
rows 27 against 27-30. Fewer rows keep drafting
in a pass of their own (:attr:`LlamaCppBatch.splits_ragged`). A stream of more cells steps
slower, though a row uses as many: 16 rows in streams of 512 cells 53-67 ms, of 1024 or more
68-98 (a row's values lie a stream's length apart: a server's ``--max-model-len``)."""


class LlamaCppBatch:
    """Rows as llama.cpp sequence ids: ``seqs[row]`` is row ``row``'s id, ``lengths[row]`` its
    cached positions; ids of rows that left are removed from the cache and reused."""

    can_join = True
    ragged = True
    compile_s = 0.0
    layers = None  # llama.cpp does not expose the hidden states
    reused = None  # no prompt cache of its own (a CachingBackend's)

    @property
    def prefixes(self) -> LlamaCppBatch:
        """Sequences kept in host memory and admitted again: :meth:`save`, :meth:`admit_saved`."""
        return self

    @property
    def joining(self) -> LlamaCppBatch:
        """Joining rows prefilled in the running rows' ``llama_batch``: :meth:`forward_joining`."""
        return self

    def __init__(
        self,
        model: LlamaCppModel,
        rows: int,
        positions: int,
        on_forward: Callable[[float], None] | None = None,
        longest: int = 0,
    ) -> None:
        """Room for ``rows`` live rows; the cache holds twice ``rows x positions`` cells (rows that
        join later may bring longer prompts), within the model's context per row, and at least
        ``longest`` (one row of the longest a server admits). Several rows get a stream each
        (:data:`STREAMS_COST`), room for ``longest`` positions, or where rows are known, twice
        ``positions``."""
        self.model, self.lib = model, model.lib
        self.sample_device = torch.device("cpu")
        self.on_forward = on_forward
        per_row = getattr(model.config, "max_position_embeddings", None) or positions
        cells = max(min(2 * positions, per_row) * rows, positions, min(longest, per_row), 256)
        room = -(-max(min(longest or 2 * positions, per_row), 256) // 256) * 256  # a stream's cells
        self.cell_bytes = model.cell_bytes()
        fits = room == 256 or rows * room <= STREAMS_COST * cells  # 256: the least a stream takes
        self.streams = rows >= STREAMS_ROWS and fits and model.plain_cache()
        self.n_stream = rows if self.streams else 1
        if self.streams:
            self.context = model.new_context(rows, rows * room, BATCH, unified=False)
        else:
            self.context = model.new_context(rows, -(-cells // 256) * 256, BATCH)
        self.threads, self.threads_set = ThreadChoice(model.threads), model.threads  # measured per pass
        self.memory = self.lib.llama_get_memory(self.context)
        self.batch = self.lib.llama_batch_init(BATCH, 0, 1)
        # The batch's arrays as numpy views, made once: ``as_array`` costs ~25 µs a call, and a
        # step fills four of them.
        self.fields = [np.ctypeslib.as_array(getattr(self.batch, name), shape=(BATCH,))
                       for name in ("token", "pos", "n_seq_id", "logits")]  # fmt: skip
        self.fields[2][:] = 1  # one sequence per entry, always
        self.seqs: list[int] = []
        self.lengths: list[int] = []
        self.free = list(range(rows - 1, -1, -1))

    @property
    def rows(self) -> int:
        return len(self.seqs)

    @property
    def splits_ragged(self) -> bool:
        """With a stream per row, llama.cpp cuts a pass whose rows feed different token counts
        into one per count and per gap in the sequence ids, each paying a pass's fixed cost."""
        return self.streams

    def admit(self, prompts: list[list[int]]) -> Tensor:
        """Each prompt under a new sequence id, in one batch; logits at each prompt's last token."""
        return self.forward_joining([[] for _ in self.seqs], prompts)[1]

    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        """One prefill; the copies' sequences share its cells (``seq_cp``)."""
        logits = self.admit([prompt])
        source = self.seqs[-1]
        for _ in range(copies - 1):
            seq = self.free.pop()
            self.lib.llama_memory_seq_cp(self.memory, source, seq, -1, -1)
            self.seqs.append(seq)
            self.lengths.append(len(prompt))
        return logits.expand(copies, -1)

    def save(self, row: int, length: int) -> HostSequence:
        """Row ``row``'s sequence state in host memory (``llama_state_seq_get_data``), of which
        the first ``length`` positions are admitted again."""
        seq = self.seqs[row]
        size = self.lib.llama_state_seq_get_size(self.context, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = self.lib.llama_state_seq_get_data(self.context, buffer, size, seq)
        return HostSequence(bytes(buffer)[:written], length, self.n_stream)

    def admit_saved(self, saved: HostSequence, length: int, rest: list[int]) -> Tensor:
        """A new last row: ``saved``'s first ``length`` positions, then ``rest`` prefilled after
        them; logits at its last token."""
        return self.forward_joining([[] for _ in self.seqs], [rest], kept=[(saved, length)])[1]

    def _restore(self, saved: HostSequence, length: int, seq: int) -> None:
        """``saved``'s first ``length`` positions into sequence ``seq`` (``llama_state_seq_set_data``)."""
        state = saved.state(self.n_stream)
        data = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not self.lib.llama_state_seq_set_data(self.context, data, len(state), seq):
            raise NoRoom("llama.cpp's cache has no room to take back a kept prompt prefix; try a smaller --batch-size")
        self.lib.llama_memory_seq_rm(self.memory, seq, length, -1)

    def step(self, tokens: Tensor) -> Tensor:
        """One token per row at its next position; next-token logits ``[rows, vocab]``."""
        return self.forward_joining([[t] for t in tokens.view(-1).tolist()], [])[0]

    def verify(self, tokens: list[list[int]]) -> Tensor:
        """Every row's tokens in one batch, logits at each: ``[rows, longest, vocab]`` (zeros past a
        row's own count)."""
        flat = self.forward_joining(tokens, [])[0]
        width = max(len(row) for row in tokens)
        if all(len(row) == width for row in tokens):
            return flat.view(len(tokens), width, -1)  # no padding: the same memory
        out = flat.new_zeros(len(tokens), width, flat.shape[-1])
        at = 0
        for r, row in enumerate(tokens):
            out[r, : len(row)] = flat[at : at + len(row)]
            at += len(row)
        return out

    def joins(self, prompts: list[list[int]], whole: Collection[int] = ()) -> bool:
        """Whether :meth:`forward_joining` takes ``prompts`` (always, with room for them)."""
        return len(prompts) <= len(self.free)

    def forward_joining(
        self,
        fed: list[list[int]],
        prompts: list[list[int]],
        whole: Collection[int] = (),
        kept: Sequence[tuple[HostSequence, int] | None] = (),
    ) -> tuple[Tensor, Tensor]:
        """One batch: each row's ``fed`` tokens at its next positions (logits at every one, in
        order, ``[fed tokens, vocab]``), then each prompt under a new sequence id, its rows last
        (logits at its last token, ``[prompts, vocab]``). A prompt is prefilled whole (as
        ``whole``, the prompt cache's, asks) unless ``kept`` gives it a kept prefix ``(saved,
        length)`` its row starts from, the prompt then being what follows it. A request that
        joins while others decode is prefilled in their pass rather than in one of its own
        (llama-server's mixed batches): a pass's fixed cost, ~14 ms beside a 3-row step of ~24 ms
        on the default model (2 cores), is paid once (docs/history/2026-12.md, 2026-12-05)."""
        if len(prompts) > len(self.free):
            raise ValueError(f"{len(prompts)} rows do not fit: room for {len(self.free)} more")
        seqs = [self.free.pop() for _ in prompts]
        sources = list(kept) or [None] * len(prompts)
        starts = [0 if source is None else source[1] for source in sources]
        running = zip(fed, self.lengths, self.seqs, strict=True)
        entries = [(t, n + i, s, True) for row, n, s in running for i, t in enumerate(row)]
        joining = zip(prompts, starts, seqs, strict=True)
        entries += [(t, n + i, s, i == len(p) - 1) for p, n, s in joining for i, t in enumerate(p)]
        try:
            for seq, source in zip(seqs, sources, strict=True):
                if source is not None:
                    self._restore(*source, seq)
            logits = self._decode(entries)
        except BaseException:
            for seq in seqs:  # the prompts never joined: their ids (and any cells decoded) go back
                self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
            self._give_back(seqs)
            for seq, n, row in zip(self.seqs, self.lengths, fed, strict=True):
                if row:  # a pass cut into several llama_decode calls: what the first ones wrote goes
                    self.lib.llama_memory_seq_rm(self.memory, seq, n, -1)
            raise
        self.lengths = [n + len(row) for n, row in zip(self.lengths, fed, strict=True)]
        self.lengths += [n + len(p) for n, p in zip(starts, prompts, strict=True)]
        self.seqs += seqs
        fed_count = len(entries) - sum(map(len, prompts))
        return logits[:fed_count], logits[fed_count:]

    def rollback(self, row: int, length: int) -> None:
        """Row ``row`` forgets its positions from ``length`` on."""
        self.lib.llama_memory_seq_rm(self.memory, self.seqs[row], length, -1)
        self.lengths[row] = min(self.lengths[row], length)

    def keep(self, rows: list[int]) -> None:
        """The rows that left give their cells and sequence ids back."""
        kept = set(rows)
        left = [seq for r, seq in enumerate(self.seqs) if r not in kept]
        for seq in left:
            self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self._give_back(left)
        self.seqs = [self.seqs[r] for r in rows]
        self.lengths = [self.lengths[r] for r in rows]

    def _give_back(self, seqs: list[int]) -> None:
        """Sequence ids free again; the lowest is taken first, so that the rows' streams stay
        consecutive (llama.cpp decodes a run of consecutive streams in one pass, and cuts a
        pass at every gap)."""
        self.free = sorted([*self.free, *seqs], reverse=True)

    def agree(self, tokens: Tensor) -> Tensor:
        return tokens

    def close(self) -> None:
        """Free the batch and the context (the KV cache); idempotent."""
        context, self.context = self.context, None
        if context:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(context)

    def _decode(self, entries: list[Entry]) -> Tensor:
        """Decode ``(token, position, sequence, wants logits)`` entries, ``BATCH`` at a time; the
        logits of the entries that want them, in order, ``[wanted, vocab]``.

        llama.cpp multiplies a pass of one token by one kernel and a pass of several by another
        (llamafile's sgemm, from two columns on), and the two sum in different orders: a
        position's numbers would depend on how its prompt was cut into passes. So a pass is one
        token (a step of one row) or at least two, and the output matrix has one row or at least
        two: a pass of several tokens that wants one row of logits computes the row before it
        too (:func:`passes`). A prompt then gives the same numbers prefilled whole, in chunks, or
        after a kept prefix (a chat's next turn: :class:`~llmsample.engine.session.Session`)."""
        start = time.perf_counter()
        vocab = self.model.n_vocab
        out = torch.empty(sum(e[3] for e in entries), vocab, dtype=torch.float32)
        entries, rows_out = self._in_stream_order(entries)
        at = 0
        for chunk, skip in passes(entries):
            self._fill(chunk)
            threads = self.threads.next()
            if threads != self.threads_set:
                self.lib.llama_set_n_threads(self.context, threads, threads)
                self.threads_set = threads
            began = time.perf_counter()
            code = self.lib.llama_decode(self.context, self.batch)
            self.threads.timed(threads, len(chunk), time.perf_counter() - began)
            if code != 0:
                raise (NoRoom if code == 1 else RuntimeFailure)(decode_error(code, len(chunk)))
            wanted = sum(e[3] for e in chunk) - (skip is not None)
            if wanted:
                rows = range(at, at + wanted) if rows_out is None else rows_out[at : at + wanted]
                self._copy_logits(out, skip == 0, rows)
                at += wanted
        if self.on_forward is not None:
            self.on_forward(time.perf_counter() - start)
        return out

    def _in_stream_order(self, entries: list[Entry]) -> tuple[list[Entry], list[int] | None]:
        """``entries`` as llama.cpp decodes them in the fewest passes, and where each wanted
        logit row goes in the caller's order (None: in order). With a stream per sequence,
        llama.cpp's pass takes consecutive sequence ids, found from the batch's first entry on:
        so the entries go by sequence id (each one's in order). Else as given."""
        if not self.streams or all(a[2] <= b[2] for a, b in itertools.pairwise(entries)):
            return entries, None
        order = sorted(range(len(entries)), key=lambda i: entries[i][2])
        out_row = list(itertools.accumulate(e[3] for e in entries))
        return [entries[i] for i in order], [out_row[i] - 1 for i in order if entries[i][3]]

    def _copy_logits(self, out: Tensor, skip_first: bool, rows: range | list[int]) -> None:
        """The last pass's wanted logit rows from llama.cpp's output buffer into ``out``'s
        ``rows`` (one copy for a range); ``skip_first``: its first output row was only computed
        (:func:`passes`)."""
        row_bytes = out.shape[-1] * out.element_size()
        source = ctypes.cast(self.lib.llama_get_logits(self.context), ctypes.c_void_p).value or 0
        source += row_bytes if skip_first else 0
        if isinstance(rows, range):
            ctypes.memmove(out.data_ptr() + rows.start * row_bytes, source, len(rows) * row_bytes)
            return
        for i, row in enumerate(rows):
            ctypes.memmove(out.data_ptr() + row * row_bytes, source + i * row_bytes, row_bytes)

    def _fill(self, chunk: list[Entry]) -> None:
        batch = self.batch
        n = len(chunk)
        batch.n_tokens = n
        tokens, positions, seqs, wants = zip(*chunk, strict=True)
        token, pos, _, logits = self.fields
        token[:n], pos[:n], logits[:n] = tokens, positions, wants
        seq_id = batch.seq_id
        for i, seq in enumerate(seqs):
            seq_id[i][0] = seq


def passes(entries: list[Entry]) -> Iterator[tuple[list[Entry], int | None]]:
    """The ``llama_decode`` calls for ``entries``: at most ``BATCH`` each, none of one token
    unless there is one in all (the last two calls share what would leave one over), and a call
    of several tokens that wants one output also wants its neighbour's, computed and dropped.
    Yields each call's entries and the index, among its outputs, of the one dropped (None)."""
    starts = list(range(0, len(entries), BATCH))
    if len(starts) > 1 and len(entries) - starts[-1] == 1:
        starts[-1] -= 1
    for first, end in zip(starts, [*starts[1:], len(entries)], strict=True):
        chunk = entries[first:end]
        wanted = [i for i, entry in enumerate(chunk) if entry[3]]
        if len(chunk) < 2 or len(wanted) != 1:
            yield chunk, None
            continue
        extra = wanted[0] - 1 if wanted[0] > 0 else 1
        chunk = list(chunk)
        chunk[extra] = (*chunk[extra][:3], True)
        yield chunk, 0 if extra < wanted[0] else 1


def decode_error(code: int, tokens: int) -> str:
    """llama_decode's return code as one line."""
    if code == 1:
        return f"llama.cpp's cache has no room for {tokens} more tokens; try a smaller --batch-size or --max-tokens"
    if code == 2:
        return "llama.cpp's decode was aborted"
    return f"llama.cpp could not decode a batch of {tokens} tokens (error {code})"
