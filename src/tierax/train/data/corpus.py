"""A corpus as the loader sees it: token shards read as one sequence, with document boundaries.

Whatever wrote it (``tierax data prepare``, another pipeline's flat array, Megatron's
indexed dataset), a corpus is one sequence of ``num_tokens`` token ids, memory-mapped
shard by shard, plus (where the format records them) the end offset of every document.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Corpus:
    """Token shards read as one sequence.

    Attributes:
      name: where it came from (for messages).
      shards: the token arrays (memory-mapped), in order.
      doc_ends: the end offset of each document (increasing, the last one
        ``num_tokens``), or None where the format records no boundaries.
      vocab_size: ids are below this (from the tokenizer, or one past the largest id).
      identity: what names the content for checkpoints (hashes, not paths).
      tokenizer: the tokenizer's record (``index.json``), None if unknown.
    """

    name: str
    shards: list[np.ndarray]
    doc_ends: np.ndarray | None
    vocab_size: int
    identity: dict
    tokenizer: dict | None = None
    _starts: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._starts = [0]
        for s in self.shards:
            self._starts.append(self._starts[-1] + len(s))

    @property
    def num_tokens(self) -> int:
        return self._starts[-1]

    @property
    def num_documents(self) -> int | None:
        return None if self.doc_ends is None else len(self.doc_ends)

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens ``start : start + n`` as int32 (a window may span shards)."""
        out = np.empty(n, np.int32)
        i = bisect.bisect_right(self._starts, start) - 1
        done = 0
        while done < n:
            lo = start + done - self._starts[i]
            take = min(n - done, len(self.shards[i]) - lo)
            out[done : done + take] = self.shards[i][lo : lo + take]
            done += take
            i += 1
        return out

    def segments(self, start: int, n: int) -> np.ndarray:
        """Segment ids of tokens ``start : start + n``: 0 for the first token's document, +1
        at each document start after it (int32).  One segment if the format has no boundaries."""
        seg = np.zeros(n, np.int32)
        if self.doc_ends is None:
            return seg
        lo = np.searchsorted(self.doc_ends, start, side="right")
        hi = np.searchsorted(self.doc_ends, start + n - 1, side="right")
        seg[self.doc_ends[lo:hi] - start] = 1  # a document ending at e: the next one starts at e
        return np.cumsum(seg, dtype=np.int32)
