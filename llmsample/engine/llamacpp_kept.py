"""A llama.cpp backend's kept prompt prefix in host memory (:class:`~llmsample.engine.llamacpp_batch.
LlamaCppBatch`'s ``save``): a sequence's state, which this backend or a later one of any stream
count admits again."""

from __future__ import annotations

import numpy as np

STATE_HEAD = 8
"""Bytes before the stream count in a sequence's state: llama.cpp's magic number, the sequence id."""


class HostSequence:
    """A kept prefix in host memory: the cells of its ``length`` positions as llama.cpp's
    sequence state; any backend of the same model admits from it
    (:meth:`LlamaCppBatch.admit_saved`)."""

    def __init__(self, data: bytes, length: int, streams: int) -> None:
        """``streams``: the stream count of the context that wrote ``data``."""
        self.data, self.length, self.nbytes, self.streams = data, length, len(data), streams

    def state(self, streams: int) -> bytes:
        """The state for a context of ``streams`` streams. llama.cpp writes a sequence's state as
        a magic number and the sequence id, the stream count, then each stream's cell count (4
        bytes each) and, after the one count that is not 0, that stream's cells; it restores the
        cells into the receiving sequence's own stream, whichever they came from, but refuses
        another stream count. So the count is rewritten and the empty streams' zeros moved after
        the cells (a plain KV cache's state:
        :meth:`~llmsample.models.llamacpp_model.LlamaCppModel.plain_cache`)."""
        if streams == self.streams:
            return self.data
        head = STATE_HEAD
        counts = np.frombuffer(self.data, dtype=np.uint32, count=self.streams, offset=head + 4)
        full = np.flatnonzero(counts)
        if full.size == 0:
            return self.data[:head] + np.uint32(streams).tobytes() + bytes(4 * streams)
        before, after = int(full[0]), self.streams - 1 - int(full[0])
        cells = self.data[head + 4 + 4 * before : len(self.data) - 4 * after]
        return self.data[:head] + np.uint32(streams).tobytes() + cells + bytes(4 * (streams - 1))

    def release(self) -> None:
        self.data = b""
