"""Data-preparation checks an outside mutation audit found unchecked (issue 60): a prepared
directory whose document ends do not end at its token count is refused, and a tiktoken file's
vocabulary counts Llama 3's 256 special tokens beside the file's ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tokenizer_files as TF

from tierax.errors import TieraxError
from tierax.train.data import pipeline, prepared
from tierax.train.data.tokenizer import load_tokenizer


def test_document_ends_that_miss_the_token_count_are_refused(tmp_path):
    """The document file's last end is the split's token count; one that is not (here one short,
    the file's size unchanged, checksums not read) is a damaged directory, named as such."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(5)))
    out = tmp_path / "tokens"
    index = pipeline.prepare([docs], out, shard_tokens=1000)
    split = index["splits"]["train"]
    good = prepared.open_prepared(out)
    assert good.doc_ends[-1] == split["num_tokens"] == good.num_tokens
    f = out / split["documents"]["file"]
    ends = np.fromfile(f, "<i8")
    ends[-1] -= 1
    ends.tofile(f)
    with pytest.raises(TieraxError, match="shards and documents do not add up.*damaged"):
        prepared.open_prepared(out, verify=False)


def test_a_tiktoken_files_vocabulary_counts_its_256_special_tokens(tmp_path):
    path = TF.tiktoken_file(tmp_path / "tt")
    ranks = len(path.read_text().splitlines())  # one BASE64 RANK line per token
    tok = load_tokenizer(path)
    assert tok.info.vocab_size == ranks + 256 == tok.enc.n_vocab  # tiktoken's own count
    # the specials are ids ranks … ranks + 255: BOS and EOS the first two, every one in range
    assert (tok.info.bos_id, tok.info.eos_id) == (ranks, ranks + 1)
    last = load_tokenizer(path, eos="<|reserved_special_token_253|>").info.eos_id
    assert last == ranks + 255 == tok.info.vocab_size - 1
