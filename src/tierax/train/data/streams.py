"""What the trainer opens: the batch stream and validation batches of a ``data`` config section,
and which rows of a batch this process supplies."""

from __future__ import annotations

from tierax.errors import TieraxError
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
    weights = [w for _, w in sets] if data.mixture is not None else None
    return EpochLoader(corpora, shape, seed=seed, weights=weights, document_mask=data.document_mask)


def open_validation(
    data, global_batch: int, seq: int, *, vocab_size: int
) -> SequentialLoader | None:
    """The validation batches (None when ``data.validation_every`` is 0).

    From ``data.validation_path`` if set, else the ``validation`` split of ``data.path``.

    Raises:
      TieraxError: no validation data, or too little of it.
    """
    if not data.validation_every:
        return None
    if data.validation_path is not None:
        path, split = data.validation_path, "train"
    elif data.path is not None:
        path, split = data.path, "validation"
    else:
        raise TieraxError(
            "data.validation_every is set but there is no validation data: set "
            "data.validation_path (a mixture has no validation split of its own)"
        )
    corpus = open_corpus(path, split=split, dtype=data.dtype, verify=data.verify)
    check_vocab(corpus, vocab_size)
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
