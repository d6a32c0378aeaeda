"""Documents of a corpus, read one at a time: text files, JSONL, Parquet.

* a **text file** is one document (its whole content, UTF-8);
* a **JSONL** file (``.jsonl``, ``.ndjson``, ``.json``) has one JSON object per line, the
  document in a string field (``--field``, default ``text``); blank lines are skipped;
* a **Parquet** file (told by its ``PAR1`` magic) has the documents in a string column
  (``--field``), read one row group batch at a time (needs ``pyarrow``).

Any of them may be gzip-compressed (told by the gzip magic).  A gzip whose payload starts with
``PAR1`` is Parquet (whatever its name); otherwise the kind comes from the name without ``.gz``.
Parquet needs random access, so a compressed one is first decompressed to a temporary
file.  Memory is bounded by the largest document (and a Parquet read batch), not by the corpus:
a document larger than ``max_document_bytes`` is refused.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from tierax.errors import TieraxError
from tierax.train.data.tokenizer import _need

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_MAGIC = b"PAR1"
GZIP_MAGIC = b"\x1f\x8b"
PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True)
class Document:
    """One document: its text, and where it came from (for messages)."""

    text: str | bytes  # bytes only for byte-level text files (no decoding needed)
    where: str
    nbytes: int  # input bytes it accounts for (the progress bar's unit)


def input_kind(path: pathlib.Path) -> tuple[str, bool]:
    """(``text`` | ``jsonl`` | ``parquet``, gzip-compressed) of an input file.

    Raises:
      TieraxError: the file does not exist or is a directory.
    """
    if not path.exists():
        raise TieraxError(f"input {str(path)!r} does not exist; give text, JSONL or Parquet files")
    if path.is_dir():
        raise TieraxError(
            f"input {str(path)!r} is a directory; give the text, JSONL or Parquet files in it"
        )
    if not path.is_file():
        raise TieraxError(f"input {str(path)!r} is not a file; give text, JSONL or Parquet files")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise TieraxError(f"input {str(path)!r} cannot be read ({e.strerror or e})") from None
    if head == PARQUET_MAGIC:
        return "parquet", False
    gz = head[:2] == GZIP_MAGIC
    if gz:
        try:
            with gzip.open(path, "rb") as f:
                payload = f.read(4)
        except (OSError, EOFError, zlib.error) as e:
            raise TieraxError(
                f"input {str(path)!r} is not intact gzip ({e}); give an intact file"
            ) from None
        if payload == PARQUET_MAGIC:
            return "parquet", True
    name = path.name[:-3] if gz and path.name.endswith(".gz") else path.name
    return ("jsonl" if name.lower().endswith(JSONL_SUFFIXES) else "text"), gz


def _open_binary(path: pathlib.Path, gz: bool):
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _too_big(where: str, size: int, limit: int) -> TieraxError:
    return TieraxError(
        f"{where}: a document of {size:,} bytes, more than the limit of {limit:,} "
        f"(--max-document-mib {limit >> 20}); split it into smaller documents (e.g. one per JSONL "
        "line) or raise the limit"
    )


def _text_document(path: pathlib.Path, gz: bool, limit: int, raw_bytes: bool) -> Iterator[Document]:
    with _open_binary(path, gz) as f:
        raw = f.read(limit + 1)
        if len(raw) > limit:  # the whole document's size, not where reading stopped
            size = len(raw) + sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
            raise _too_big(str(path), size, limit)
    if raw_bytes:
        yield Document(raw, str(path), len(raw))
        return
    try:
        yield Document(raw.decode("utf-8"), str(path), len(raw))
    except UnicodeDecodeError as e:
        raise TieraxError(
            f"text file {str(path)!r} is not UTF-8 ({e.reason} at byte {e.start}); convert it to "
            "UTF-8, or use --tokenizer bytes"
        ) from None


def _jsonl_documents(path: pathlib.Path, gz: bool, field: str, limit: int) -> Iterator[Document]:
    with _open_binary(path, gz) as f:
        for n, line in enumerate(f, 1):
            where = f"{path} line {n}"
            if len(line) > limit:
                raise _too_big(where, len(line), limit)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, UnicodeDecodeError) as e:
                raise TieraxError(
                    f"{where}: not a JSON object ({e}); each line of a JSONL file is one JSON "
                    "object"
                ) from None
            if not isinstance(obj, dict):
                raise TieraxError(
                    f"{where}: a JSON {type(obj).__name__}, not an object; each line of a "
                    f"JSONL file is one object with the document in its {field!r} field"
                )
            if field not in obj:
                keys = ", ".join(list(obj)[:10]) or "none"
                raise TieraxError(
                    f"{where}: no field {field!r} (its fields: {keys}); name the document's field "
                    "with --field"
                )
            text = obj[field]
            if not isinstance(text, str):
                raise TieraxError(
                    f"{where}: field {field!r} is a {type(text).__name__}, not a string; "
                    "name a text field with --field"
                )
            yield Document(text, where, len(line))


def _parquet_documents(
    path: pathlib.Path, gz: bool, field: str, limit: int
) -> Iterator[Document]:
    if not gz:
        yield from _parquet_rows(path, path, field, limit)
        return
    # Parquet's footer is at the end and its columns are read by offset: decompress to a temporary
    # file (deleted on close) and read that.
    with tempfile.TemporaryFile(prefix="tierax-parquet-") as tmp:
        with gzip.open(path, "rb") as f:
            shutil.copyfileobj(f, tmp, 1 << 20)
        tmp.seek(0)
        yield from _parquet_rows(tmp, path, field, limit)


def _parquet_rows(source, path: pathlib.Path, field: str, limit: int) -> Iterator[Document]:
    pa = _need("pyarrow", "reading Parquet")
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as e:
        raise TieraxError(
            f"Parquet file {str(path)!r} cannot be read ({e}); give an intact Parquet file"
        ) from None
    schema = pf.schema_arrow
    if field not in schema.names:
        raise TieraxError(
            f"Parquet file {str(path)!r} has no column {field!r} (its columns: "
            f"{', '.join(schema.names)}); name the text column with --field"
        )
    typ = schema.field(field).type
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        raise TieraxError(
            f"Parquet file {str(path)!r}: column {field!r} is {typ}, not a string column; "
            "name a text column with --field"
        )
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[field]):
            for text in batch.column(0).to_pylist():
                row += 1
                where = f"{path} row {row}"
                if text is None:
                    raise TieraxError(f"{where}: column {field!r} is null; drop the row or fill it")
                if len(text) > limit:  # characters ≤ bytes: checked again on the encoded size below
                    raise _too_big(where, len(text.encode("utf-8")), limit)
                yield Document(text, where, len(text))
    except pa.ArrowException as e:
        raise TieraxError(
            f"Parquet file {str(path)!r} cannot be read at row {row + 1} ({e}); give an intact "
            "Parquet file"
        ) from None


def read_documents(
    paths: list[str | os.PathLike],
    *,
    field: str = "text",
    max_document_bytes: int = 64 << 20,
    raw_bytes: bool = False,
) -> Iterator[Document]:
    """Every document of ``paths``, in order.

    Args:
      field: the JSONL field / Parquet column holding the text.
      raw_bytes: text files as bytes (byte-level tokenizer: no UTF-8 check).

    Raises:
      TieraxError: a missing input, a line that is not a JSON object or lacks ``field``
        (named with its line number), a non-string column, a document over the limit.
    """
    for p in map(pathlib.Path, paths):
        kind, gz = input_kind(p)
        try:
            if kind == "parquet":
                yield from _parquet_documents(p, gz, field, max_document_bytes)
            elif kind == "jsonl":
                yield from _jsonl_documents(p, gz, field, max_document_bytes)
            else:
                yield from _text_document(p, gz, max_document_bytes, raw_bytes)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise TieraxError(
                f"input {str(p)!r} is not intact gzip ({e}); give an intact file"
            ) from None


def input_bytes(paths: list[str | os.PathLike]) -> int | None:
    """The inputs' total uncompressed size where it is known up front (the progress bar's total);
    None with a compressed or Parquet input."""
    total = 0
    for p in map(pathlib.Path, paths):
        kind, gz = input_kind(p)
        if gz or kind == "parquet":
            return None
        total += p.stat().st_size
    return total
