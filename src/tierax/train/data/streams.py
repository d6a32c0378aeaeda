"""What the trainer opens: the batch stream and validation batches of a ``data`` config section,
and which rows of a batch this process supplies."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from tierax.errors import TieraxError
from tierax.train.data import prepared
from tierax.train.data.corpus import Corpus
from tierax.train.data.formats import open_corpus
from tierax.train.data.loader import BatchShape, EpochLoader, SequentialLoader, SyntheticStream


def check_vocab(corpus: Corpus, vocab_size: int) -> None:
    """Refuse token data with ids the model's embedding does not have.

    Raises:
      TieraxError: the data's vocabulary (or largest id + 1) exceeds ``vocab_size``.
    """
    if corpus.vocab_size <= vocab_size:
        return
    v = corpus.vocab_size
    if corpus.tokenizer is not None:
        what = f"{v} token ids ({corpus.tokenizer.get('kind')} tokenizer)"
    else:
        what = f"token ids up to {v - 1}"
    raise TieraxError(
        f"the token data in {corpus.name!r} has {what} but the model's vocab_size is "
        f"{vocab_size}; use a model with vocab_size ≥ {v} (e.g. model.vocab_size={v})"
    )


def _tokenizer_of(corpus: Corpus) -> tuple[str, str | None] | None:
    t = corpus.tokenizer
    return None if t is None else (str(t.get("kind")), t.get("sha256"))


def _describe(corpus: Corpus) -> str:
    kind, sha = _tokenizer_of(corpus)
    return f"{corpus.name!r} ({kind} tokenizer" + (f", SHA-256 {sha[:12]}…)" if sha else ")")


def check_same_tokenizer(corpora: Sequence[Corpus], what: str = "data.mixture") -> None:
    """Refuse token data made with different tokenizers (token ids would mean different things).

    Compared by the tokenizer's kind and file SHA-256 that ``tierax data prepare`` records in
    ``index.json``; data without a record (a ``.npy``, a Megatron prefix) cannot be compared.

    Raises:
      TieraxError: two of ``corpora`` record different tokenizers (both named).
    """
    known = [c for c in corpora if _tokenizer_of(c) is not None]
    for other in known[1:]:
        if _tokenizer_of(other) != _tokenizer_of(known[0]):
            raise TieraxError(
                f"{what}: {_describe(known[0])} and {_describe(other)} were prepared with "
                "different tokenizers, so their token ids mean different things; prepare every "
                "dataset with the same --tokenizer"
            )


def tokenizer_notes(corpora: Sequence[Corpus], what: str = "data") -> list[str]:
    """Notes where token data with a tokenizer record is mixed with data without one (a ``.npy``,
    a Megatron prefix): their tokenizers cannot be compared, so nothing checked that the ids mean
    the same things (:func:`check_same_tokenizer` compares recorded ones only)."""
    known = [c for c in corpora if _tokenizer_of(c) is not None]
    unknown = [c for c in corpora if _tokenizer_of(c) is None]
    if not known or not unknown:
        return []
    return [
        f"{what}: {c.name!r} records no tokenizer (raw token ids), so it cannot be compared with "
        f"{_describe(known[0])}; make sure it was tokenized with the same tokenizer (or prepare it "
        "with `tierax data prepare --tokenizer`)"
        for c in unknown
    ]


def _open(path: str, data, split: str, vocab_size: int) -> Corpus:
    corpus = open_corpus(path, split=split, dtype=data.dtype, verify=data.verify)
    check_vocab(corpus, vocab_size)
    return corpus


def open_stream(data, shape: BatchShape, *, seed: int, vocab_size: int):
    """The training batch stream of a :class:`~tierax.train.sections.DataConfig`.

    Raises:
      TieraxError: missing or damaged data, a vocabulary larger than the model's, too few tokens.
    """
    if data.source == "synthetic":
        return SyntheticStream(shape, seed=seed, vocab_size=vocab_size)
    sets = data.datasets()
    corpora = [_open(p, data, "train", vocab_size) for p, _ in sets]
    check_same_tokenizer(corpora)
    weights = [w for _, w in sets] if data.mixture is not None else None
    return EpochLoader(corpora, shape, seed=seed, weights=weights, document_mask=data.document_mask)


def _content(corpus: Corpus) -> dict:
    """What the tokens are (the identity's hashes and counts), not which split they were."""
    return {k: v for k, v in corpus.identity.items() if k != "split"}


def _validation_split(path: str) -> str:
    """The split of ``data.validation_path`` to read: a token directory's ``validation`` split
    where it has one (else its only data, ``train``); a single file's tokens."""
    p = pathlib.Path(path)
    if not p.is_dir():
        return "train"
    splits = prepared.read_index(p).get("splits")
    return "validation" if isinstance(splits, dict) and "validation" in splits else "train"


def open_validation(
    data,
    global_batch: int,
    seq: int,
    *,
    vocab_size: int,
    training: Sequence[Corpus] = (),
) -> SequentialLoader | None:
    """The validation batches (None when ``data.validation_every`` is 0).

    From ``data.validation_path`` if set (a token directory: its ``validation`` split where it
    has one), else the ``validation`` split of ``data.path``.

    Args:
      training: the training corpora: validation data with the same content as one of them, or
        made with another tokenizer, is refused.

    Raises:
      TieraxError: no validation data, too little of it, the training data itself, or another
        tokenizer's.
    """
    if not data.validation_every:
        return None
    if data.validation_path is not None:
        path = data.validation_path
        split = _validation_split(path)
    elif data.path is not None:
        path, split = data.path, "validation"
    else:
        raise TieraxError(
            "data.validation_every is set but there is no validation data: set "
            "data.validation_path (a mixture has no validation split of its own)"
        )
    corpus = open_corpus(path, split=split, dtype=data.dtype, verify=data.verify)
    check_vocab(corpus, vocab_size)
    for train in training:
        if _content(train) == _content(corpus):
            raise TieraxError(
                f"data.validation_path: {corpus.name!r} is the training data {train.name!r} "
                "itself, so the validation loss would be the training loss; give held-out data "
                "(e.g. a directory prepared with --validation-fraction: its validation split is "
                "read)"
            )
    check_same_tokenizer([*training, corpus], "data.validation_path")
    return SequentialLoader(
        corpus, global_batch, seq, data.validation_batches, document_mask=data.document_mask
    )


def local_rows(sharding, global_shape: tuple[int, ...], axis: int = 1) -> tuple[int, int]:
    """The contiguous range of ``axis`` indices this process's devices hold under ``sharding``.

    Raises:
      TieraxError: the process's rows are not one contiguous block (a device order
        ``jax.make_array_from_process_local_data`` cannot express).
    """
    spans = set()
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        start, stop, _ = index[axis].indices(global_shape[axis])
        spans.add((start, stop))
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    if sum(b - a for a, b in spans) != hi - lo:
        raise TieraxError(
            f"this process's devices hold batch rows {sorted(spans)}, which are not "
            "contiguous; order the mesh devices by process"
        )
    return lo, hi
