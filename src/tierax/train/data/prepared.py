"""The token directory ``tierax data prepare`` writes, and reading it back.

Layout (format ``tierax.tokens/2``)::

    DIR/index.json                 written last: a directory with an index is complete
    DIR/train-00000.bin ...        token shards, raw little-endian ids (dtype in the index)
    DIR/train-docs.bin             int64 end offset of every document (cumulative)
    DIR/validation-00000.bin ...   the held-out documents (--validation-fraction), likewise

``index.json`` records the tokenizer (kind, file content SHA-256, vocabulary size, BOS/EOS ids),
the token dtype, and per split the token and document counts, each shard's token count and
SHA-256, and the document file with its SHA-256.  A reader checks every size, and (``verify``)
every checksum, before it hands out a token.

Directories of the first format (``tierax.tokens/1``: byte-level ``tokens.bin``) are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re

import numpy as np

from tierax.errors import TieraxError
from tierax.train.data.corpus import Corpus
from tierax.train.data.tokenizer import sha256_file

FORMAT = "tierax.tokens/2"
FORMAT_V1 = "tierax.tokens/1"
INDEX = "index.json"
TOKENS_V1 = "tokens.bin"
SPLITS = ("train", "validation")
HINT = "prepare one with `tierax data prepare INPUT... --out DIR`"
_FLUSH_BYTES = 8 << 20


def shard_name(split: str, i: int) -> str:
    return f"{split}-{i:05d}.bin"


def docs_name(split: str) -> str:
    return f"{split}-docs.bin"


class SplitWriter:
    """Appends documents' tokens to the shards of one split (``DIR/SPLIT-NNNNN.bin``).

    Each shard holds ``shard_tokens`` tokens (the last one fewer); a document may span
    two shards.  SHA-256 is computed while writing.
    """

    def __init__(self, directory: pathlib.Path, split: str, dtype: str, shard_tokens: int):
        self.dir, self.split, self.dtype, self.shard_tokens = (
            directory,
            split,
            np.dtype(dtype),
            shard_tokens,
        )
        self.shards: list[dict] = []
        self.num_tokens = 0
        self._file = None
        self._hash = None
        self._in_shard = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._docs = open(directory / docs_name(split), "wb")
        self._docs_hash = hashlib.sha256()
        self._doc_ends: list[int] = []

    def _open_shard(self) -> None:
        name = shard_name(self.split, len(self.shards))
        self._file, self._hash, self._in_shard = open(self.dir / name, "wb"), hashlib.sha256(), 0
        self.shards.append({"file": name, "num_tokens": 0, "sha256": None})

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._file.write(data)
            self._hash.update(data)
            self._pending, self._pending_bytes = [], 0

    def _close_shard(self) -> None:
        self._flush()
        self._file.close()
        self.shards[-1].update(num_tokens=self._in_shard, sha256=self._hash.hexdigest())
        self._file = None

    def add(self, tokens: np.ndarray, lengths: np.ndarray | None = None) -> None:
        """Append documents: ``tokens`` end to end, ``lengths`` each (default: one document)."""
        data = np.ascontiguousarray(tokens, dtype=self.dtype.newbyteorder("<"))
        at = 0
        while at < len(data):
            if self._file is None:
                self._open_shard()
            take = min(len(data) - at, self.shard_tokens - self._in_shard)
            chunk = data[at : at + take].tobytes()
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)
            self._in_shard += take
            at += take
            if self._in_shard == self.shard_tokens:
                self._close_shard()
            elif self._pending_bytes >= _FLUSH_BYTES:
                self._flush()
        lengths = np.array([len(data)]) if lengths is None else np.asarray(lengths)
        self._doc_ends.extend((self.num_tokens + np.cumsum(lengths)).tolist())
        self.num_tokens += len(data)
        if len(self._doc_ends) >= 1 << 16:
            self._write_doc_ends()

    def _write_doc_ends(self) -> None:
        raw = np.asarray(self._doc_ends, "<i8").tobytes()
        self._docs.write(raw)
        self._docs_hash.update(raw)
        self._doc_ends = []

    @property
    def num_documents(self) -> int:
        return self._docs_written + len(self._doc_ends)

    @property
    def _docs_written(self) -> int:
        return self._docs.tell() // 8

    def close(self) -> dict:
        """Finish the files; the split's entry of ``index.json``."""
        if self._file is not None:
            self._close_shard()
        self._write_doc_ends()
        n_docs = self._docs_written
        self._docs.close()
        return {
            "num_tokens": self.num_tokens,
            "num_documents": n_docs,
            "shards": self.shards,
            "documents": {"file": docs_name(self.split), "sha256": self._docs_hash.hexdigest()},
        }

    def abort(self) -> None:
        for f in (self._file, self._docs):
            if f is not None and not f.closed:
                f.close()


_OWN_NAME = re.compile("(?:" + "|".join(SPLITS) + r")-(?:\d{5}|docs)\.bin")


def written_files(directory: pathlib.Path) -> list[str]:
    """The files of a token directory that ``tierax data prepare`` wrote: its index, the files the
    index lists, and files bearing its own shard names; ``index.json`` first.  Anything else in
    the directory is the user's."""
    d = pathlib.Path(directory)
    names = {INDEX, TOKENS_V1}
    try:
        index = json.loads((d / INDEX).read_text())
        for split in index.get("splits", {}).values():
            names.update(str(sh["file"]) for sh in split.get("shards", []))
            names.add(str(split["documents"]["file"]))
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        pass  # a damaged index: its own names still say what it wrote
    names.update(p.name for p in d.iterdir() if _OWN_NAME.fullmatch(p.name))
    found = [n for n in names if "/" not in n and (d / n).is_file() and not (d / n).is_symlink()]
    return sorted(found, key=lambda n: (n != INDEX, n))


def write_index(directory: pathlib.Path, index: dict) -> None:
    (directory / INDEX).write_text(json.dumps(index, indent=2) + "\n")


# --- reading ------------------------------------------------------------------------------


def read_index(path: str | os.PathLike) -> dict:
    """The ``index.json`` of a token directory, checked for its format.

    Raises:
      TieraxError: a missing directory or index, an unreadable index, another format.
    """
    d = pathlib.Path(path)
    if not d.is_dir():
        raise TieraxError(f"token directory {str(path)!r} does not exist; {HINT}")
    if not (d / INDEX).is_file():
        raise TieraxError(f"{str(d)!r} has no {INDEX}: not a (complete) token directory; {HINT}")
    try:
        index = json.loads((d / INDEX).read_text())
    except (OSError, ValueError) as e:
        raise TieraxError(f"{d / INDEX}: not a token index ({e}); {HINT}") from None
    if not isinstance(index, dict) or index.get("format") not in (FORMAT, FORMAT_V1):
        got = index.get("format") if isinstance(index, dict) else None
        raise TieraxError(f"{d / INDEX}: format {got!r}, expected {FORMAT!r}; {HINT}")
    return index


def _checked_file(path: pathlib.Path, nbytes: int, sha256: str | None, verify: bool) -> None:
    if not path.is_file() or path.stat().st_size != nbytes:
        raise TieraxError(
            f"{path}: missing or not {nbytes} bytes as {INDEX} says; the directory is "
            f"damaged or incomplete; {HINT}"
        )
    if verify and sha256 is not None and sha256_file(path) != sha256:
        raise TieraxError(
            f"{path}: checksum mismatch (its SHA-256 differs from {INDEX}): the file was "
            f"changed or damaged after it was prepared; {HINT}"
        )


def _v1_corpus(d: pathlib.Path, index: dict, verify: bool) -> Corpus:
    try:
        n, dtype, tok = int(index["num_tokens"]), np.dtype(index["dtype"]), index["tokenizer"]
        vocab, source_sha = int(index["vocab_size"]), index["source_sha256"]
    except (KeyError, TypeError, ValueError) as e:
        raise TieraxError(
            f"{d / INDEX}: not a token index ({e!r} missing or wrong); {HINT}"
        ) from None
    # Byte-level tokens are the source bytes, so the source's hash checks the token file.
    _checked_file(d / TOKENS_V1, n * dtype.itemsize, source_sha if tok == "bytes" else None, verify)
    tokens = np.memmap(d / TOKENS_V1, dtype=dtype, mode="r")
    identity = {"tokenizer": tok, "source_sha256": source_sha, "num_tokens": n}
    return Corpus(
        str(d),
        [tokens],
        np.array([n], np.int64),
        vocab,
        identity,
        {"kind": tok, "vocab_size": vocab, "bos_id": None, "eos_id": None},
    )


def open_prepared(path: str | os.PathLike, split: str = "train", *, verify: bool = True) -> Corpus:
    """One split of a token directory as a :class:`Corpus`.

    Args:
      verify: check every shard's and the document file's SHA-256 against the index
        (reads every byte once); sizes are always checked.

    Raises:
      TieraxError: no such directory or split, a file missing or of the wrong size, or
        (``verify``) a checksum mismatch; each names the file and the fix.
    """
    d = pathlib.Path(path)
    index = read_index(d)
    if index["format"] == FORMAT_V1:
        if split != "train":
            raise TieraxError(
                f"{d} (format {FORMAT_V1}) has no {split} split; prepare it again with "
                "--validation-fraction"
            )
        return _v1_corpus(d, index, verify)
    try:
        dtype = np.dtype(index["dtype"]).newbyteorder("<")
        tokenizer = index["tokenizer"]
        splits = index["splits"]
    except (KeyError, TypeError) as e:
        raise TieraxError(f"{d / INDEX}: not a token index ({e!r} missing); {HINT}") from None
    if split not in splits:
        have = ", ".join(splits) or "none"
        raise TieraxError(
            f"{d} has no {split} split (it has: {have}); prepare it with "
            "--validation-fraction F to hold out validation documents"
        )
    s = splits[split]
    shards = []
    for sh in s["shards"]:
        f = d / sh["file"]
        _checked_file(f, sh["num_tokens"] * dtype.itemsize, sh["sha256"], verify)
        shards.append(
            np.memmap(f, dtype=dtype, mode="r") if sh["num_tokens"] else np.zeros(0, dtype)
        )
    docs_file = d / s["documents"]["file"]
    _checked_file(docs_file, s["num_documents"] * 8, s["documents"]["sha256"], verify)
    doc_ends = np.fromfile(docs_file, dtype="<i8") if s["num_documents"] else np.zeros(0, np.int64)
    if sum(len(x) for x in shards) != s["num_tokens"] or (
        len(doc_ends) and doc_ends[-1] != s["num_tokens"]
    ):
        raise TieraxError(
            f"{d / INDEX}: the {split} split's shards and documents do not add up to its "
            f"{s['num_tokens']} tokens; the directory is damaged; {HINT}"
        )
    content = hashlib.sha256("".join(sh["sha256"] for sh in s["shards"]).encode()).hexdigest()
    identity = {
        "format": FORMAT,
        "tokenizer_sha256": tokenizer.get("sha256"),
        "split": split,
        "num_tokens": s["num_tokens"],
        "content_sha256": content,
    }
    return Corpus(
        f"{d} ({split})", shards, doc_ends, int(tokenizer["vocab_size"]), identity, tokenizer
    )
