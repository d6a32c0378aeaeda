"""Batches of packed windows: epochs without replacement, weighted mixtures, any process's rows.

**Packing.**  A corpus's documents lie end to end (each framed by its BOS/EOS); window ``w``
is tokens ``w·seq : w·seq + seq + 1`` (inputs and next-token targets), so the ``(n − 1) // seq``
windows of an ``n``-token corpus cover every target once.  With ``document_mask`` each window
also carries segment ids (one per document piece in it) for the attention mask and the loss.

**Order.**  The sequences of the whole run are numbered: sequence ``p`` is row ``r`` of
microbatch ``a`` of step ``s`` with ``p = ((s − 1)·accum + a)·global_batch + r``.  One corpus:
sequence ``p`` is position ``p mod N`` of epoch ``p // N`` (``N`` windows), and each epoch
visits the windows in the order of a keyed permutation
(:func:`~tierax.train.data.permutation.permute`, key ``(seed, corpus, epoch)``): every window
once per epoch, a fresh order each epoch.  A mixture first deals the sequences out to its
corpora: each block of ``MIX_BLOCK`` sequences gives corpus ``d`` ``round(weight_d ·
MIX_BLOCK)`` of them (largest remainders), in a keyed shuffled order, and each corpus numbers
its own sequences and runs its own epochs.

Everything is a pure function of ``(seed, step)``: a process computes only its own rows, and a
resumed run, whatever its process count, reads exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tierax.errors import TieraxError
from tierax.train.data.corpus import Corpus
from tierax.train.data.permutation import permute, round_keys

MIX_BLOCK = 4096
ORDER = "epoch-permutation/1"  # recorded in checkpoints: a different order is a different run
_EPOCH_TAG = 0x45504F43
_MIX_TAG = 0x4D4958


@dataclass(frozen=True)
class BatchShape:
    """One optimizer step's input: ``accum × global_batch`` sequences of ``seq + 1`` tokens."""

    accum: int
    global_batch: int
    seq: int

    @property
    def global_shape(self) -> tuple[int, int, int]:
        return (self.accum, self.global_batch, self.seq + 1)


def windows_of(corpus: Corpus, seq: int) -> int:
    """How many windows of ``seq + 1`` tokens (stride ``seq``) the corpus holds.

    Raises:
      TieraxError: not even one.
    """
    n = (corpus.num_tokens - 1) // seq
    if n < 1:
        raise TieraxError(
            f"the token data in {corpus.name!r} has {corpus.num_tokens} tokens, fewer than one "
            f"sequence (seq + 1 = {seq + 1}); use a shorter seq or more text"
        )
    return n


def mixture_counts(weights: list[float], block: int = MIX_BLOCK) -> np.ndarray:
    """Sequences per block for each corpus: ``weights`` scaled to ``block``, largest remainders.

    Raises:
      TieraxError: a weight that is not positive, or one too small to get a sequence per block.
    """
    w = np.asarray(weights, np.float64)
    if len(w) == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise TieraxError(f"mixture weights must be positive numbers, got {list(weights)}")
    exact = w / w.sum() * block
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: block - counts.sum()]] += 1
    if np.any(counts == 0):
        i = int(np.flatnonzero(counts == 0)[0])
        raise TieraxError(
            f"mixture weight {weights[i]} is below 1/{block} of the total; raise it or drop "
            "that dataset"
        )
    return counts


class EpochLoader:
    """Batches from one corpus or a weighted mixture, in epochs (see the module docstring).

    Args:
      corpora: the datasets; ``weights`` (one per corpus) mixes them, None for one corpus.
      shape: the step's batch shape.
      seed: the order's key.
      document_mask: also hand out segment ids (:meth:`batch`).
    """

    def __init__(
        self,
        corpora: list[Corpus],
        shape: BatchShape,
        *,
        seed: int,
        weights: list[float] | None = None,
        document_mask: bool = False,
    ):
        if weights is not None and len(weights) != len(corpora):
            raise TieraxError(f"{len(weights)} mixture weights for {len(corpora)} datasets")
        if weights is None and len(corpora) != 1:
            raise TieraxError("several datasets need mixture weights")
        self.corpora, self.shape, self.seed, self.document_mask = (
            corpora,
            shape,
            seed,
            document_mask,
        )
        self.windows = [windows_of(c, shape.seq) for c in corpora]
        self.weights = weights
        self.counts = mixture_counts(weights) if weights is not None else None
        self._cum = None if self.counts is None else np.concatenate([[0], np.cumsum(self.counts)])

    # --- where sequence p comes from ----------------------------------------------------------
    def _deal(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(corpus, that corpus's own sequence number) of global sequence numbers ``p``."""
        if self.counts is None:
            return np.zeros_like(p), p
        block, slot = p // MIX_BLOCK, p % MIX_BLOCK
        label = np.empty_like(p)
        for b in np.unique(block):
            sel = block == b
            label[sel] = permute(slot[sel], MIX_BLOCK, round_keys([self.seed, _MIX_TAG, int(b)]))
        d = np.searchsorted(self._cum, label, side="right") - 1
        return d, block * self.counts[d] + (label - self._cum[d])

    def _window(self, d: int, q: np.ndarray) -> np.ndarray:
        n = self.windows[d]
        epoch, i = q // n, q % n
        out = np.empty_like(q)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = permute(i[sel], n, round_keys([self.seed, _EPOCH_TAG, d, int(e)]))
        return out

    def locate(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(corpus, window) of each global sequence number in ``p``."""
        p = np.asarray(p, np.int64)
        d, q = self._deal(p.ravel())
        w = np.empty_like(q)
        for c in np.unique(d):
            sel = d == c
            w[sel] = self._window(int(c), q[sel])
        return d.reshape(p.shape), w.reshape(p.shape)

    def sequence_numbers(self, step: int, lo: int, hi: int) -> np.ndarray:
        """Global sequence numbers of rows ``lo:hi`` of each microbatch of ``step``:
        [accum, hi − lo]."""
        a, b = self.shape.accum, self.shape.global_batch
        return ((step - 1) * a + np.arange(a)[:, None]) * b + np.arange(lo, hi)[None, :]

    # --- batches ------------------------------------------------------------------------------
    def batch(self, step: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows ``lo:hi`` of each microbatch of ``step``: int32 tokens ``[accum, hi − lo, seq + 1]``
        and, with ``document_mask``, their segment ids (same shape), else None."""
        d, w = self.locate(self.sequence_numbers(step, lo, hi))
        n = self.shape.seq + 1
        tokens = np.empty((*d.shape, n), np.int32)
        segs = np.empty_like(tokens) if self.document_mask else None
        for idx in np.ndindex(d.shape):
            corpus, start = self.corpora[d[idx]], int(w[idx]) * self.shape.seq
            tokens[idx] = corpus.read(start, n)
            if segs is not None:
                segs[idx] = corpus.segments(start, n)
        return tokens, segs

    def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
        """The tokens of :meth:`batch`."""
        return self.batch(step, lo, hi)[0]

    def epochs(self, step: int) -> list[float]:
        """Per corpus, epochs completed after ``step`` steps (fractional)."""
        used = step * self.shape.accum * self.shape.global_batch
        if self.counts is None:
            return [used / self.windows[0]]
        full, rest = divmod(used, MIX_BLOCK)
        per = full * self.counts
        if rest:
            label = permute(np.arange(rest), MIX_BLOCK, round_keys([self.seed, _MIX_TAG, full]))
            per = per + np.bincount(
                np.searchsorted(self._cum, label, side="right") - 1, minlength=len(self.corpora)
            )
        return [float(u) / n for u, n in zip(per, self.windows, strict=True)]

    def identity(self) -> dict:
        """What names this data and its order for checkpoints (content hashes, not paths)."""
        return {
            "order": ORDER,
            "document_mask": self.document_mask,
            "weights": self.weights,
            "corpora": [c.identity for c in self.corpora],
        }

    def describe(self) -> str:
        parts = [
            f"{c.name}: {n:,} windows" for c, n in zip(self.corpora, self.windows, strict=True)
        ]
        return "; ".join(parts)


class SequentialLoader:
    """The first ``batches`` batches of a corpus's windows, in order (validation batches)."""

    def __init__(
        self,
        corpus: Corpus,
        global_batch: int,
        seq: int,
        batches: int,
        *,
        document_mask: bool = False,
    ):
        self.corpus, self.global_batch, self.seq, self.batches = corpus, global_batch, seq, batches
        self.document_mask = document_mask
        n = windows_of(corpus, seq)
        if n < batches * global_batch:
            raise TieraxError(
                f"the validation data {corpus.name!r} has {n} windows of {seq + 1} tokens, fewer "
                f"than data.validation_batches × global batch = {batches} × {global_batch}; "
                "lower data.validation_batches or hold out more documents"
            )

    def batch(self, v: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows ``lo:hi`` of validation batch ``v``: int32 ``[hi − lo, seq + 1]``; segment ids."""
        n = self.seq + 1
        tokens = np.empty((hi - lo, n), np.int32)
        segs = np.empty_like(tokens) if self.document_mask else None
        for r in range(lo, hi):
            start = (v * self.global_batch + r) * self.seq
            tokens[r - lo] = self.corpus.read(start, n)
            if segs is not None:
                segs[r - lo] = self.corpus.segments(start, n)
        return tokens, segs


class SyntheticStream:
    """Uniform random tokens; row ``r`` of microbatch ``a`` of ``step`` comes from its own
    generator ``SeedSequence([seed, step, a, r])``, so a process draws only its rows."""

    document_mask = False

    def __init__(self, shape: BatchShape, *, seed: int, vocab_size: int):
        self.shape, self.seed, self.vocab_size = shape, seed, vocab_size

    def identity(self) -> dict:
        return {"synthetic_vocab": self.vocab_size}

    def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
        out = np.empty((self.shape.accum, hi - lo, self.shape.seq + 1), np.int32)
        for a in range(self.shape.accum):
            for r in range(lo, hi):
                rng = np.random.Generator(
                    np.random.PCG64(np.random.SeedSequence([self.seed, step, a, r]))
                )
                out[a, r - lo] = rng.integers(0, self.vocab_size, size=self.shape.seq + 1)
        return out

    def batch(self, step: int, lo: int, hi: int) -> tuple[np.ndarray, None]:
        return self.rows(step, lo, hi), None

    def epochs(self, step: int) -> list[float]:
        return []

    def describe(self) -> str:
        return f"synthetic tokens (vocabulary {self.vocab_size})"
