"""Training data: prepared byte-level token files and a synthetic stream.

``tierax data prepare TEXT --out DIR`` writes two files:

* ``tokens.bin`` — the tokens, one after another, as raw ``uint8`` (``uint16``
  if a tokenizer's vocabulary exceeds 256), memory-mapped when read;
* ``index.json`` — ``{"format", "num_tokens", "dtype", "tokenizer", "vocab_size",
  "source", "source_sha256"}``, written last, so a directory with an index is complete.

The tokenizer is **byte-level**: each byte of the UTF-8 file is one token
(vocabulary 256, ids 0–255); no merges, no special tokens.

Batches are a pure function of ``(seed, step)``: a sequence of step ``s`` starts
at an offset drawn from ``numpy.random.Generator(PCG64(SeedSequence([seed, s])))``
(sampling with replacement), so a resumed run sees exactly the batches an
uninterrupted one would, whatever the process count.  Each process reads only the
rows its devices hold and hands them to ``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile
from dataclasses import asdict, dataclass

import numpy as np

from tierax.errors import TieraxError
from tierax.fileio import new_file_mode, write_text_atomic

FORMAT = "tierax.tokens/1"
TOKENIZER = "bytes"
BYTE_VOCAB = 256
INDEX = "index.json"
TOKENS = "tokens.bin"


@dataclass(frozen=True)
class TokenIndex:
    """The ``index.json`` of a prepared token directory."""

    num_tokens: int
    dtype: str
    tokenizer: str
    vocab_size: int
    source: str
    source_sha256: str
    format: str = FORMAT


def prepare_text(text_file: str | os.PathLike, out_dir: str | os.PathLike) -> TokenIndex:
    """Tokenize a text file byte-level into ``out_dir`` (``tokens.bin`` + ``index.json``).

    Both files are written to temporaries and renamed into place, the index last:
    an interrupted run leaves no index, and a reader never takes a half-written
    directory for a complete one.

    Raises:
      TieraxError: the text file is missing or empty, or ``out_dir`` is a file.
    """
    src = pathlib.Path(text_file)
    if src.is_dir():
        raise TieraxError(f"text file {str(text_file)!r} is a directory; give a text file")
    if not src.is_file():
        raise TieraxError(f"text file {str(text_file)!r} does not exist")
    raw = src.read_bytes()
    if not raw:
        raise TieraxError(f"text file {str(src)!r} is empty")
    out = pathlib.Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TieraxError(f"--out {str(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    tokens = np.frombuffer(raw, dtype=np.uint8)  # byte-level: the bytes are the token ids
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{TOKENS}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(tokens.tobytes())
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would outlive the rename
        os.replace(tmp, out / TOKENS)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    index = TokenIndex(
        num_tokens=int(tokens.size),
        dtype="uint8",
        tokenizer=TOKENIZER,
        vocab_size=BYTE_VOCAB,
        source=str(src),
        source_sha256=hashlib.sha256(raw).hexdigest(),
    )
    write_text_atomic(out / INDEX, json.dumps(asdict(index), indent=2) + "\n")
    return index


def read_index(path: str | os.PathLike) -> TokenIndex:
    """The index of a prepared token directory.

    Raises:
      TieraxError: missing directory or index, an unreadable index, or a token
        file whose size does not match it.
    """
    d = pathlib.Path(path)
    hint = "prepare one with `tierax data prepare TEXT_FILE --out DIR`"
    if not d.is_dir():
        raise TieraxError(f"token directory {str(path)!r} does not exist; {hint}")
    if not (d / INDEX).is_file():
        raise TieraxError(f"{str(d)!r} has no {INDEX}: not a (complete) token directory; {hint}")
    try:
        raw = json.loads((d / INDEX).read_text())
        index = TokenIndex(**raw)
    except (OSError, ValueError, TypeError) as e:
        raise TieraxError(f"{d / INDEX}: not a token index ({e}); {hint}") from None
    if index.format != FORMAT:
        raise TieraxError(f"{d / INDEX}: format {index.format!r}, expected {FORMAT!r}; {hint}")
    tokens = d / TOKENS
    expected = index.num_tokens * np.dtype(index.dtype).itemsize
    if not tokens.is_file() or tokens.stat().st_size != expected:
        raise TieraxError(f"{tokens}: missing or not {expected} bytes as {INDEX} says; {hint}")
    if index.tokenizer == TOKENIZER and _sha256(tokens) != index.source_sha256:
        # Byte-level tokens are the source bytes, so the source's hash checks the token file.
        raise TieraxError(f"{tokens}: contents differ from {INDEX} (sha256 mismatch): the file was changed or "
                          f"damaged after it was prepared; {hint}")
    return index


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class BatchShape:
    """What one optimizer step consumes: ``accum × global_batch`` sequences of ``seq + 1`` tokens."""

    accum: int
    global_batch: int
    seq: int

    @property
    def global_shape(self) -> tuple[int, int, int]:
        return (self.accum, self.global_batch, self.seq + 1)


class TokenStream:
    """Windows of ``seq + 1`` tokens at (seed, step)-determined offsets of a token file."""

    def __init__(self, path: str | os.PathLike, shape: BatchShape, *, seed: int, vocab_size: int):
        self.index = read_index(path)
        if self.index.vocab_size > vocab_size:
            raise TieraxError(
                f"the token data in {str(path)!r} has {self.index.vocab_size} token ids ({self.index.tokenizer} "
                f"tokenizer) but the model's vocab_size is {vocab_size}; use a model with vocab_size ≥ "
                f"{self.index.vocab_size} (e.g. model.vocab_size={self.index.vocab_size})"
            )
        if self.index.num_tokens < shape.seq + 1:
            raise TieraxError(
                f"the token data in {str(path)!r} has {self.index.num_tokens} tokens, fewer than one sequence "
                f"(seq + 1 = {shape.seq + 1}); use a shorter seq or more text"
            )
        self.tokens = np.memmap(pathlib.Path(path) / TOKENS, dtype=self.index.dtype, mode="r")
        self.shape, self.seed = shape, seed

    def identity(self) -> dict:
        """What names this data for checkpoints (the source text's hash, not its path)."""
        return {"tokenizer": self.index.tokenizer, "source_sha256": self.index.source_sha256,
                "num_tokens": self.index.num_tokens}

    def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` of every microbatch of ``step``: int32 ``[accum, hi - lo, seq + 1]``."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, step])))
        n = self.shape.seq + 1
        starts = rng.integers(0, self.index.num_tokens - n + 1, size=(self.shape.accum, self.shape.global_batch))
        return self.tokens[starts[:, lo:hi, None] + np.arange(n)].astype(np.int32)


class SyntheticStream:
    """Uniform random tokens; row ``r`` of microbatch ``a`` of ``step`` comes from its own
    generator ``SeedSequence([seed, step, a, r])``, so a process draws only its rows."""

    def __init__(self, shape: BatchShape, *, seed: int, vocab_size: int):
        self.shape, self.seed, self.vocab_size = shape, seed, vocab_size

    def identity(self) -> dict:
        return {"synthetic_vocab": self.vocab_size}

    def rows(self, step: int, lo: int, hi: int) -> np.ndarray:
        out = np.empty((self.shape.accum, hi - lo, self.shape.seq + 1), np.int32)
        for a in range(self.shape.accum):
            for r in range(lo, hi):
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, step, a, r])))
                out[a, r - lo] = rng.integers(0, self.vocab_size, size=self.shape.seq + 1)
        return out


def open_stream(source: str, path: str | None, shape: BatchShape, *, seed: int, vocab_size: int):
    """The batch stream of a :class:`tierax.train.config.DataConfig` (``source``, ``path``)."""
    if source == "synthetic":
        return SyntheticStream(shape, seed=seed, vocab_size=vocab_size)
    return TokenStream(path, shape, seed=seed, vocab_size=vocab_size)


def local_rows(sharding, global_shape: tuple[int, ...], axis: int = 1) -> tuple[int, int]:
    """The contiguous range of ``axis`` indices this process's devices hold under ``sharding``.

    Raises:
      TieraxError: the process's rows are not one contiguous block (a device order
        ``jax.make_array_from_process_local_data`` cannot express).
    """
    spans = set()
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        s = index[axis]
        start, stop, _ = s.indices(global_shape[axis])
        spans.add((start, stop))
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    if sum(b - a for a, b in spans) != hi - lo:
        raise TieraxError(f"this process's devices hold batch rows {sorted(spans)}, which are not contiguous; "
                          "order the mesh devices by process")
    return lo, hi
