"""``tierax data prepare``: documents → tokenizer → token shards, streamed to a temporary directory.

Documents are read one at a time (:mod:`~tierax.train.data.documents`), encoded in batches of
a few MiB of text (the tokenizer's own batch encoder, multi-threaded where it has one), framed
with BOS/EOS (:meth:`~tierax.train.data.tokenizer.Tokenizer.frame`) and appended to the
shards of their split (:mod:`~tierax.train.data.prepared`).  Memory is bounded by one batch
and the largest document, whatever the corpus size.

``validation_fraction`` holds out whole documents: a document goes to the validation split when
a hash of its text falls below the fraction, so the choice depends on the document alone (not
on its position), is the same on every run, and puts repeated copies of a text in one split.

Everything is written to a temporary directory beside ``out`` and renamed into place when
complete; on any error the temporary directory is removed and ``out`` is left as it was.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
from collections.abc import Callable, Sequence

import numpy as np

from tierax.errors import TieraxError
from tierax.fileio import check_output_dir, make_temp_dir
from tierax.train.data import documents as docs_lib
from tierax.train.data import prepared
from tierax.train.data.tokenizer import Tokenizer, load_tokenizer, token_dtype

BATCH_BYTES = 4 << 20  # text handed to the tokenizer per call
BATCH_DOCS = 4096
DEFAULT_SHARD_TOKENS = 1 << 28

Progress = Callable[[int, int], None]  # (input bytes, tokens) done since the last call


def held_out(text: str | bytes, fraction: float) -> bool:
    """Whether a document goes to the validation split (a function of its text alone)."""
    if fraction <= 0:
        return False
    raw = text.encode("utf-8") if isinstance(text, str) else text
    h = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
    return h < fraction * 2**64


def _check_out(out: pathlib.Path, overwrite: bool) -> None:
    check_output_dir(out, "--out")
    if out.is_dir() and any(out.iterdir()):
        if not (out / prepared.INDEX).is_file():
            raise TieraxError(
                f"--out {str(out)!r} exists, is not empty and is not a token directory; "
                "nothing in it is replaced — give a new or empty directory"
            )
        if not overwrite:
            raise TieraxError(
                f"--out {str(out)!r} already holds prepared tokens; pass --overwrite to "
                "replace them, or give another directory"
            )


def _install(tmp: pathlib.Path, out: pathlib.Path) -> None:
    """Move the finished ``tmp`` to ``out``.  In a previous token directory there, only the files
    tierax wrote (:func:`prepared.written_files`) are replaced; anything else in it stays."""
    if not out.exists():
        os.replace(tmp, out)
        return
    if not any(out.iterdir()):
        out.rmdir()
        os.replace(tmp, out)
        return
    old = make_temp_dir(out.parent, out.name + ".old")
    for name in prepared.written_files(out):  # the old index first: no stale index meanwhile
        os.replace(out / name, old / name)
    new = sorted((p.name for p in tmp.iterdir()), key=lambda n: (n == prepared.INDEX, n))
    for name in new:  # the new index last
        os.replace(tmp / name, out / name)
    tmp.rmdir()
    shutil.rmtree(old, ignore_errors=True)


def _batches(documents, limit_bytes: int, limit_docs: int):
    batch, size = [], 0
    for d in documents:
        batch.append(d)
        size += d.nbytes
        if size >= limit_bytes or len(batch) >= limit_docs:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def prepare(
    inputs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    tokenizer: str = "bytes",
    field: str = "text",
    validation_fraction: float = 0.0,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    bos: str | None = None,
    eos: str | None = None,
    max_document_bytes: int = 64 << 20,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict:
    """Tokenize ``inputs`` into the token directory ``out``; returns its ``index.json`` content.

    Args:
      tokenizer: ``bytes`` or a tokenizer file (kind detected from its content).
      field: the JSONL field / Parquet column with the text.
      validation_fraction: the share of documents held out as the validation split.
      shard_tokens: tokens per shard file.
      bos, eos: override the tokenizer's BOS / EOS token (``none``: no BOS).
      overwrite: replace the files of a token directory already at ``out`` (only those tierax
        wrote: other files in it stay; anything else is never replaced).
      progress: called with (input bytes, tokens) as documents are written.

    Raises:
      TieraxError: bad inputs, tokenizer or options (nothing written); a document-level
        problem (named with its file and line or row) removes everything written so far.
    """
    if not inputs:
        raise TieraxError("no input files; give text, JSONL or Parquet files to tokenize")
    if not 0 <= validation_fraction < 1:
        raise TieraxError(f"--validation-fraction must be in [0, 1), got {validation_fraction}")
    if shard_tokens < 1:
        raise TieraxError(f"--shard-tokens must be ≥ 1, got {shard_tokens}")
    for p in inputs:
        docs_lib.input_kind(pathlib.Path(p))
    _check_distinct(inputs)
    out = pathlib.Path(out)
    _check_out(out, overwrite)
    tok = load_tokenizer(tokenizer, bos=bos, eos=eos)
    dtype = token_dtype(tok.info.vocab_size)

    tmp = make_temp_dir(out.parent, out.name)
    writers: list[prepared.SplitWriter] = []
    try:
        train = prepared.SplitWriter(tmp, "train", dtype, shard_tokens)
        writers.append(train)
        valid = None
        if validation_fraction > 0:
            valid = prepared.SplitWriter(tmp, "validation", dtype, shard_tokens)
            writers.append(valid)
        skipped = _write(
            tok, inputs, field, max_document_bytes, validation_fraction, train, valid, progress
        )
        splits = {w.split: w.close() for w in writers}
        _check_splits(splits, validation_fraction)
        index = {
            "format": prepared.FORMAT,
            "dtype": dtype,
            "vocab_size": tok.info.vocab_size,
            "tokenizer": {
                "kind": tok.info.kind,
                "file": tok.info.file,
                "sha256": tok.info.sha256,
                "vocab_size": tok.info.vocab_size,
                "bos_id": tok.info.bos_id,
                "eos_id": tok.info.eos_id,
                "add_bos": tok.info.add_bos,
            },
            "field": field,
            "validation_fraction": validation_fraction,
            "shard_tokens": shard_tokens,
            "sources": [{"path": str(p), "bytes": pathlib.Path(p).stat().st_size} for p in inputs],
            "skipped_empty_documents": skipped,
            "splits": splits,
        }
        prepared.write_index(tmp, index)
        _install(tmp, out)
        return index
    except BaseException:
        for w in writers:
            w.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(
    tok: Tokenizer,
    inputs,
    field: str,
    max_document_bytes: int,
    fraction: float,
    train: prepared.SplitWriter,
    valid: prepared.SplitWriter | None,
    progress: Progress | None,
) -> int:
    vocab = tok.info.vocab_size
    raw_bytes = tok.info.kind == "bytes"
    documents = docs_lib.read_documents(
        list(inputs), field=field, max_document_bytes=max_document_bytes, raw_bytes=raw_bytes
    )
    skipped = 0
    for batch in _batches(documents, BATCH_BYTES, BATCH_DOCS):
        kept = [d for d in batch if len(d.text)]
        skipped += len(batch) - len(kept)
        encoded = tok.encode_batch([d.text for d in kept])
        parts: dict[bool, tuple[list, list]] = {False: ([], []), True: ([], [])}
        for d, ids in zip(kept, encoded, strict=True):
            if len(ids) and int(ids.max()) >= vocab:  # a tokenizer overrunning its own vocabulary
                raise TieraxError(
                    f"{d.where}: the tokenizer produced id {int(ids.max())}, outside its "
                    f"vocabulary of {vocab}; the tokenizer file is inconsistent"
                )
            pieces, lengths = parts[valid is not None and held_out(d.text, fraction)]
            pieces.extend(tok.frame(ids))
            lengths.append(len(ids) + tok.extra_tokens)
        ntokens = 0
        for to_valid, (pieces, lengths) in parts.items():
            if lengths:  # one write per split and batch
                (valid if to_valid else train).add(np.concatenate(pieces), lengths)
                ntokens += sum(lengths)
        if progress is not None:
            progress(sum(d.nbytes for d in batch), ntokens)
    return skipped


def _check_splits(splits: dict, fraction: float) -> None:
    train, valid = splits["train"], splits.get("validation")
    total = train["num_documents"] + (valid["num_documents"] if valid else 0)
    if total == 0:
        raise TieraxError("the inputs hold no documents (all empty); give inputs with text")
    if train["num_documents"] == 0:
        raise TieraxError(
            f"every one of the {total} documents was held out for validation; lower "
            "--validation-fraction or give more documents"
        )
    if valid is not None and valid["num_documents"] == 0:
        raise TieraxError(
            f"no document of the {total} was held out at --validation-fraction {fraction} "
            "(whole documents are held out); raise the fraction or give more documents"
        )


def _check_distinct(inputs: Sequence[str | os.PathLike]) -> None:
    """Refuse an input given twice (its documents would be counted twice), by the file it names."""
    seen: dict[pathlib.Path, str] = {}
    for p in inputs:
        same = pathlib.Path(p).expanduser().resolve()
        if same in seen:
            raise TieraxError(
                f"input {str(p)!r} is {seen[same]!r} again: its documents would be tokenized and "
                "counted twice; give each input once"
            )
        seen[same] = str(p)


def prepare_text(text_file: str | os.PathLike, out_dir: str | os.PathLike, **kwargs) -> dict:
    """Byte-level tokens of one text file (what ``make demo`` trains on)."""
    return prepare([text_file], out_dir, **kwargs)
