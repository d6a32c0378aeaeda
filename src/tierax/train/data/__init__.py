"""Training data: tokenizers, prepared token directories, other tools' token files, the loader.

* :mod:`~tierax.train.data.tokenizer` — tokenizer files read from disk (kind from content);
* :mod:`~tierax.train.data.documents` — documents of text, JSONL and Parquet inputs;
* :mod:`~tierax.train.data.pipeline` — ``tierax data prepare``: documents → token shards;
* :mod:`~tierax.train.data.prepared` — the token directory format and its reader;
* :mod:`~tierax.train.data.formats` — flat arrays and Megatron datasets, and :func:`open_corpus`;
* :mod:`~tierax.train.data.corpus` — a corpus as the loader sees it;
* :mod:`~tierax.train.data.permutation` — the keyed permutation behind epoch order;
* :mod:`~tierax.train.data.loader` — packed windows in epochs, mixtures, validation batches;
* :mod:`~tierax.train.data.streams` — what the trainer opens from its ``data`` config section.
"""

from tierax.train.data.corpus import Corpus
from tierax.train.data.documents import input_bytes
from tierax.train.data.formats import open_corpus
from tierax.train.data.loader import BatchShape, EpochLoader, SequentialLoader, SyntheticStream
from tierax.train.data.pipeline import prepare, prepare_text
from tierax.train.data.prepared import FORMAT, INDEX, open_prepared, read_index, shard_name
from tierax.train.data.streams import check_vocab, local_rows, open_stream, open_validation
from tierax.train.data.tokenizer import load_tokenizer

__all__ = [
    "FORMAT",
    "INDEX",
    "BatchShape",
    "Corpus",
    "EpochLoader",
    "SequentialLoader",
    "SyntheticStream",
    "check_vocab",
    "input_bytes",
    "load_tokenizer",
    "local_rows",
    "open_corpus",
    "open_prepared",
    "open_stream",
    "open_validation",
    "prepare",
    "prepare_text",
    "read_index",
    "shard_name",
]
