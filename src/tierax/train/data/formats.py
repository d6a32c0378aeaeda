"""Token files made by other tools, read in place as a :class:`~tierax.train.data.corpus.Corpus`.

* a **flat array** of ids: ``.npy`` (told by its ``\\x93NUMPY`` magic; dtype from its header),
  or raw ``.bin`` (the dtype must be given: ``data.dtype``); no document boundaries;
* a **Megatron indexed dataset** (``PREFIX.bin`` + ``PREFIX.idx``, Megatron-LM's
  ``IndexedDataset``, told by the ``MMIDIDX`` magic of the ``.idx``): its sequences lie end to
  end in the ``.bin``; its document index gives the document boundaries.

These formats carry no tokenizer record, so the data is read once when opened: the largest id
(checked against the model's vocabulary) and the SHA-256 (the data's identity in checkpoints).

:func:`open_corpus` picks the reader from the path's content: a directory with ``index.json``
(``tierax data prepare``), a Megatron pair, a ``.npy``, else a raw flat file.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import struct

import numpy as np

from tierax.errors import TieraxError
from tierax.train.data import prepared
from tierax.train.data.corpus import Corpus

NPY_MAGIC = b"\x93NUMPY"
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
# Megatron-LM's DType codes (megatron/core/datasets/indexed_dataset.py).
MEGATRON_DTYPES = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float64",
    7: "float32",
    8: "uint16",
}
FLAT_DTYPES = ("uint8", "uint16", "int32", "uint32", "int64")
_SCAN_TOKENS = 1 << 24


def _scan(name: str, tokens: np.ndarray) -> tuple[int, str]:
    """(largest id, SHA-256 of the raw bytes), one pass; refuses negative ids."""
    h = hashlib.sha256()
    top = -1
    for at in range(0, len(tokens), _SCAN_TOKENS):
        chunk = np.asarray(tokens[at : at + _SCAN_TOKENS])
        h.update(chunk.tobytes())
        if len(chunk):
            lo, hi = int(chunk.min()), int(chunk.max())
            if lo < 0:
                raise TieraxError(
                    f"{name}: token id {lo} at or after position {at} is negative; this is "
                    "not a token file (or the dtype is wrong)"
                )
            top = max(top, hi)
    return top, h.hexdigest()


def _corpus(name: str, tokens: np.ndarray, doc_ends: np.ndarray | None, kind: str) -> Corpus:
    if len(tokens) == 0:
        raise TieraxError(f"{name}: no tokens; give a non-empty token file")
    top, sha = _scan(name, tokens)
    identity = {"format": kind, "num_tokens": len(tokens), "sha256": sha}
    return Corpus(name, [tokens], doc_ends, top + 1, identity, None)


def open_flat(path: pathlib.Path, dtype: str | None) -> Corpus:
    """A flat token array: ``.npy`` (1-D, integer) or raw little-endian ids of ``dtype``.

    Raises:
      TieraxError: an unreadable or non-1-D ``.npy``, a raw file without a dtype or whose
        size is not a whole number of ids, negative ids.
    """
    with open(path, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if head == NPY_MAGIC:
        try:
            tokens = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as e:
            raise TieraxError(f"{path}: not a readable .npy file ({e})") from None
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise TieraxError(
                f"{path}: a {tokens.dtype} array of shape {tokens.shape}; a token file is a "
                "1-D integer array"
            )
        return _corpus(str(path), tokens, None, "npy")
    if dtype is None:
        raise TieraxError(
            f"{path} is a raw token file (no .npy header, no Megatron .idx beside it); give "
            f"its dtype with data.dtype (one of {', '.join(FLAT_DTYPES)})"
        )
    if dtype not in FLAT_DTYPES:
        raise TieraxError(
            f"data.dtype={dtype!r} is not a token dtype; use one of {', '.join(FLAT_DTYPES)}"
        )
    dt = np.dtype(dtype).newbyteorder("<")
    size = path.stat().st_size
    if size % dt.itemsize:
        raise TieraxError(
            f"{path}: {size} bytes is not a whole number of {dtype} ids; check data.dtype"
        )
    return _corpus(str(path), np.memmap(path, dtype=dt, mode="r"), None, f"flat-{dtype}")


def megatron_pair(path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path] | None:
    """(``.bin``, ``.idx``) of the Megatron dataset ``path`` names (prefix, ``.bin`` or ``.idx``);
    None if it is not one."""
    prefix = path.with_suffix("") if path.suffix in (".bin", ".idx") else path
    binf, idxf = prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")
    if not idxf.is_file():
        return None
    with open(idxf, "rb") as f:
        if f.read(len(MEGATRON_MAGIC)) != MEGATRON_MAGIC:
            return None
    return binf, idxf


def open_megatron(binf: pathlib.Path, idxf: pathlib.Path) -> Corpus:
    """A Megatron-LM indexed dataset (``IndexedDataset``'s ``.idx`` version 1 with its ``.bin``).

    Raises:
      TieraxError: a truncated or inconsistent index, a ``.bin`` of another size, a
        non-integer dtype, or sequences that do not lie end to end.
    """
    raw = idxf.read_bytes()
    head = len(MEGATRON_MAGIC)
    bad = f"{idxf}: not an intact Megatron index"
    if len(raw) < head + 8 + 1 + 16:
        raise TieraxError(f"{bad} (only {len(raw)} bytes)")
    (version,) = struct.unpack_from("<Q", raw, head)
    if version != 1:
        raise TieraxError(f"{idxf}: Megatron index version {version}; tierax reads version 1")
    code = raw[head + 8]
    if MEGATRON_DTYPES.get(code, "float").startswith("float"):
        raise TieraxError(f"{idxf}: dtype code {code} is not an integer token dtype")
    dt = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
    n_seq, n_doc = struct.unpack_from("<QQ", raw, head + 9)
    at = head + 9 + 16
    need = at + n_seq * 4 + n_seq * 8 + n_doc * 8
    if len(raw) < need:
        raise TieraxError(f"{bad} ({len(raw)} bytes; its counts need {need})")
    sizes = np.frombuffer(raw, "<i4", n_seq, at).astype(np.int64)
    pointers = np.frombuffer(raw, "<i8", n_seq, at + n_seq * 4)
    doc_idx = np.frombuffer(raw, "<i8", n_doc, at + n_seq * 12)
    starts = (
        np.concatenate([[0], np.cumsum(sizes)[:-1]]) * dt.itemsize
        if n_seq
        else np.zeros(0, np.int64)
    )
    if not np.array_equal(pointers, starts):
        raise TieraxError(
            f"{idxf}: its sequences do not lie end to end in {binf.name}; tierax reads "
            "contiguous Megatron datasets only"
        )
    total = int(sizes.sum())
    if not binf.is_file() or binf.stat().st_size != total * dt.itemsize:
        raise TieraxError(
            f"{binf}: missing or not {total * dt.itemsize} bytes as {idxf.name} says; the "
            "dataset is damaged or incomplete"
        )
    if n_doc < 1 or doc_idx[0] != 0 or doc_idx[-1] != n_seq or np.any(np.diff(doc_idx) < 0):
        raise TieraxError(f"{bad} (its document index is not 0 … {n_seq}, increasing)")
    seq_ends = np.cumsum(sizes)
    last_seq = doc_idx[1:][doc_idx[1:] > doc_idx[:-1]] - 1  # documents with at least one sequence
    doc_ends = np.unique(seq_ends[last_seq])
    doc_ends = doc_ends[doc_ends > 0]
    return _corpus(
        str(binf.with_suffix("")),
        np.memmap(binf, dtype=dt, mode="r"),
        doc_ends.astype(np.int64),
        "megatron",
    )


def open_corpus(
    path: str | os.PathLike, *, split: str = "train", dtype: str | None = None, verify: bool = True
) -> Corpus:
    """The corpus at ``path``, its format read from the content (see the module docstring).

    Raises:
      TieraxError: nothing there, or any problem of the format's reader.
    """
    p = pathlib.Path(path)
    if p.is_dir():
        return prepared.open_prepared(p, split, verify=verify)
    pair = megatron_pair(p)
    if pair is not None:
        _no_split(p, split)
        return open_megatron(*pair)
    if not p.is_file():
        raise TieraxError(
            f"token data {str(path)!r} does not exist; {prepared.HINT}, or give a .npy, a raw "
            ".bin (with data.dtype) or a Megatron dataset prefix"
        )
    _no_split(p, split)
    return open_flat(p, dtype)


def _no_split(p: pathlib.Path, split: str) -> None:
    if split != "train":
        raise TieraxError(
            f"{p} is a single token file with no {split} split; give the validation data "
            "with data.validation_path"
        )
