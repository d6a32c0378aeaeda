"""Tokenizers read from a file on disk, their kind told by the file's content (never downloaded).

Four kinds:

* ``bytes`` — byte-level: each byte of the UTF-8 text is a token (vocabulary 256, no
  special tokens); what ``make demo`` trains on;
* ``huggingface`` — a Hugging Face ``tokenizer.json`` (a JSON object with a ``model``), read
  by the ``tokenizers`` package;
* ``sentencepiece`` — a SentencePiece model (a serialized ``ModelProto``), read by
  ``sentencepiece``;
* ``tiktoken`` — a tiktoken BPE file (lines ``BASE64_TOKEN RANK``), e.g. Llama 3's
  ``tokenizer.model``.
  Such a file holds neither the pre-tokenizer pattern nor the special tokens: both are taken
  from Llama 3 (its pattern; ``<|begin_of_text|>`` and ``<|end_of_text|>`` right after the
  ranks, 256 special ids in all), the family that ships its tokenizer this way.

A document is encoded as ``[BOS] + ids + [EOS]``: EOS always (byte-level has none), BOS
where the tokenizer's family expects one (a SentencePiece model with a BOS id; a Hugging Face
tokenizer whose post-processor or ``tokenizer_config.json`` adds it; tiktoken files).
"""

from __future__ import annotations

import abc
import base64
import binascii
import hashlib
import json
import os
import pathlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tierax.errors import TieraxError

KINDS = ("bytes", "huggingface", "sentencepiece", "tiktoken")
INSTALL = "pip install 'tierax[data]'"

# Llama 3's pre-tokenizer pattern (Meta's llama3 tokenizer.py); tiktoken files do not carry one.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = 256
# Special tokens a tokenizer.json names, tried in this order when no tokenizer_config.json says.
EOS_NONE = "--eos none: every document needs an end-of-text token; name one with --eos TOKEN"
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|end|>", "[SEP]")
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]*={0,2} \d+$")


def _need(module: str, what: str):
    """Import an optional dependency, or say which pip command brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TieraxError(
            f"{what} needs the `{module}` package, which is not installed; install the data extra: "
            f"{INSTALL} (or pip install {module})"
        ) from None


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned dtype that holds every id of the vocabulary."""
    if vocab_size <= 1 << 8:
        return "uint8"
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise TieraxError(f"a vocabulary of {vocab_size} ids does not fit in 32-bit token ids")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def detect_kind(path: str | os.PathLike) -> str:
    """The kind of the tokenizer file at ``path``, from its first bytes (the extension is ignored).

    Raises:
      TieraxError: missing, unreadable, or none of the known kinds.
    """
    p = pathlib.Path(path)
    if not p.is_file():
        what = "is not a file" if p.exists() else "does not exist"
        raise TieraxError(
            f"tokenizer file {str(p)!r} {what}; give a tokenizer.json, a SentencePiece "
            "model or a tiktoken BPE file (or --tokenizer bytes)"
        )
    try:
        with open(p, "rb") as f:
            head = f.read(1 << 16)
    except OSError as e:
        raise TieraxError(f"tokenizer file {str(p)!r} cannot be read ({e.strerror or e})") from None
    stripped = head.lstrip()
    if stripped.startswith(b"{"):
        return "huggingface"
    pieces = head.split(b"\n")
    complete = (
        pieces[:-1] if len(pieces) > 1 else pieces
    )  # the text after the last newline may be cut off
    lines = [ln.rstrip(b"\r") for ln in complete[:8] if ln.strip()]
    if lines and all(_TIKTOKEN_LINE.match(ln) for ln in lines):
        return "tiktoken"
    if (
        head[:1] == b"\x0a"
    ):  # protobuf field 1 (pieces), length-delimited: a SentencePiece ModelProto
        return "sentencepiece"
    raise TieraxError(
        f"tokenizer file {str(p)!r} is not a tokenizer tierax reads (not a Hugging Face "
        "tokenizer.json, a SentencePiece model or a tiktoken BPE file); give one of those, "
        "or --tokenizer bytes for byte-level tokens"
    )


@dataclass(frozen=True)
class TokenizerInfo:
    """What ``index.json`` records about the tokenizer."""

    kind: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    sha256: str | None  # the tokenizer file's content (None: byte-level)
    file: str | None = None


class Tokenizer(abc.ABC):
    """A loaded tokenizer: ``encode_batch`` (content ids, no special tokens) and ``decode``, which
    each format's class implements."""

    info: TokenizerInfo

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    def frame(self, ids: np.ndarray) -> list[np.ndarray]:
        """A document's pieces: BOS (where expected), the content ids, EOS (if any)."""
        parts = [ids]
        if self.info.add_bos:
            parts.insert(0, np.array([self.info.bos_id], np.int64))
        if self.info.eos_id is not None:
            parts.append(np.array([self.info.eos_id], np.int64))
        return parts

    @property
    def extra_tokens(self) -> int:
        """How many special tokens :meth:`frame` adds to a document."""
        return int(self.info.add_bos) + int(self.info.eos_id is not None)


class ByteTokenizer(Tokenizer):
    def __init__(self):
        self.info = TokenizerInfo("bytes", 256, None, None, False, None)

    def encode_batch(self, texts):
        return [
            np.frombuffer(t.encode("utf-8") if isinstance(t, str) else t, np.uint8) for t in texts
        ]

    def decode(self, ids):
        return bytes(np.asarray(ids, np.uint8)).decode("utf-8", errors="replace")


def _special_name(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HuggingFaceTokenizer(Tokenizer):
    def __init__(self, path: pathlib.Path, bos: str | None, eos: str | None):
        tk = _need("tokenizers", "a Hugging Face tokenizer.json")
        try:
            self.tok = tk.Tokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as e:  # the Rust parser raises plain Exception
            raise TieraxError(
                f"tokenizer file {str(path)!r} looks like a Hugging Face tokenizer.json but "
                f"cannot be read ({str(e).splitlines()[0][:200]}); give an intact tokenizer.json"
            ) from None
        sha = hashlib.sha256(path.read_bytes())
        conf = {}
        side = path.with_name("tokenizer_config.json")
        if side.is_file():  # Hugging Face directories name their special tokens here
            try:
                conf = json.loads(side.read_text(encoding="utf-8"))
                sha.update(side.read_bytes())
            except (OSError, ValueError) as e:
                raise TieraxError(
                    f"{side}: not readable JSON ({e}); fix or remove it (it names the tokenizer's "
                    "BOS and EOS tokens)"
                ) from None
        vocab = self.tok.get_vocab(with_added_tokens=True)

        def find(option: str, given: str | None, conf_key: str, names: Sequence[str]) -> int | None:
            if given is not None:
                if given == "none":
                    return None
                if given not in vocab:
                    raise TieraxError(
                        f"{option} {given!r} is not a token of {path}; give one of its special "
                        "tokens"
                    )
                return vocab[given]
            name = _special_name(conf.get(conf_key))
            if name is not None and name in vocab:
                return vocab[name]
            specials = {
                t.content for t in self.tok.get_added_tokens_decoder().values() if t.special
            }
            return next((vocab[n] for n in names if n in specials or n in vocab), None)

        eos_id = find("--eos", eos, "eos_token", _EOS_NAMES)
        if eos_id is None:
            raise TieraxError(
                f"tokenizer {str(path)!r} names no end-of-text token tierax recognises "
                f"({', '.join(_EOS_NAMES)}); name it with --eos TOKEN"
            )
        bos_id = find("--bos", bos, "bos_token", _BOS_NAMES)
        if bos is not None:
            add_bos = bos_id is not None
        elif "add_bos_token" in conf:
            add_bos = bool(conf["add_bos_token"]) and bos_id is not None
        else:  # the family's own choice: does its post-processor put a BOS in front?
            with_specials = self.tok.encode("a", add_special_tokens=True).ids
            add_bos = bos_id is not None and bool(with_specials) and with_specials[0] == bos_id
        self.info = TokenizerInfo(
            "huggingface",
            self.tok.get_vocab_size(with_added_tokens=True),
            bos_id,
            eos_id,
            add_bos,
            sha.hexdigest(),
            str(path),
        )

    def encode_batch(self, texts):
        out = self.tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int64) for e in out]

    def decode(self, ids):
        return self.tok.decode(list(map(int, ids)), skip_special_tokens=False)


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: pathlib.Path, bos: str | None, eos: str | None):
        spm = _need("sentencepiece", "a SentencePiece model")
        raw = path.read_bytes()
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(raw)
        except Exception as e:  # sentencepiece raises RuntimeError or OSError for a bad proto
            raise TieraxError(
                f"tokenizer file {str(path)!r} looks like a SentencePiece model but cannot be read "
                f"({str(e).splitlines()[0][:200]}); give an intact .model file"
            ) from None

        def named(option: str, given: str) -> int | None:
            if given == "none":
                return None
            i = self.sp.piece_to_id(given)
            if i == self.sp.unk_id() and given != self.sp.id_to_piece(i):
                raise TieraxError(
                    f"{option} {given!r} is not a piece of {path}; give one of its control pieces"
                )
            return i

        eos_id = (
            named("--eos", eos)
            if eos is not None
            else (self.sp.eos_id() if self.sp.eos_id() >= 0 else None)
        )
        if eos_id is None:
            raise TieraxError(
                f"SentencePiece model {str(path)!r} has no end-of-sentence id (eos_id is -1); "
                "name its end-of-text piece with --eos PIECE"
            )
        bos_id = (
            named("--bos", bos)
            if bos is not None
            else (self.sp.bos_id() if self.sp.bos_id() >= 0 else None)
        )
        self.info = TokenizerInfo(
            "sentencepiece",
            self.sp.get_piece_size(),
            bos_id,
            eos_id,
            bos_id is not None,
            hashlib.sha256(raw).hexdigest(),
            str(path),
        )

    def encode_batch(self, texts):
        return [np.asarray(ids, np.int64) for ids in self.sp.encode(list(texts))]

    def decode(self, ids):
        return self.sp.decode(list(map(int, ids)))


def read_tiktoken_ranks(path: pathlib.Path) -> dict[bytes, int]:
    """``BASE64 RANK`` lines → {token bytes: rank}; ranks must be 0..n-1, each once.

    Raises:
      TieraxError: a malformed line (named by its number) or ranks with gaps or repeats.
    """
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            token, _, rank = line.partition(b" ")
            try:
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (binascii.Error, ValueError):
                raise TieraxError(
                    f"tokenizer file {str(path)!r} line {n}: not `BASE64_TOKEN RANK` as a "
                    "tiktoken BPE file has; give an intact file"
                ) from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TieraxError(
            f"tokenizer file {str(path)!r}: its ranks are not 0..{len(ranks) - 1}, each "
            "once (repeated tokens or gaps); give an intact tiktoken BPE file"
        )
    return ranks


class TiktokenTokenizer(Tokenizer):
    def __init__(self, path: pathlib.Path, bos: str | None, eos: str | None):
        tiktoken = _need("tiktoken", "a tiktoken BPE file")
        ranks = read_tiktoken_ranks(path)
        n = len(ranks)
        names = ["<|begin_of_text|>", "<|end_of_text|>"] + [
            f"<|reserved_special_token_{i}|>" for i in range(LLAMA3_SPECIALS - 2)
        ]
        specials = {name: n + i for i, name in enumerate(names)}
        self.enc = tiktoken.Encoding(
            name=path.name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=specials
        )

        def named(option: str, given: str) -> int | None:
            if given == "none":
                return None
            if given not in specials:
                raise TieraxError(
                    f"{option} {given!r} is not a special token of a tiktoken file (Llama 3 "
                    "layout: <|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_N|>)"
                )
            return specials[given]

        eos_id = named("--eos", eos) if eos is not None else specials["<|end_of_text|>"]
        if eos_id is None:
            raise TieraxError(EOS_NONE)
        bos_id = named("--bos", bos) if bos is not None else specials["<|begin_of_text|>"]
        self.info = TokenizerInfo(
            "tiktoken",
            n + LLAMA3_SPECIALS,
            bos_id,
            eos_id,
            bos_id is not None,
            sha256_file(path),
            str(path),
        )

    def encode_batch(self, texts):
        return [np.asarray(ids, np.int64) for ids in self.enc.encode_ordinary_batch(list(texts))]

    def decode(self, ids):
        return self.enc.decode(list(map(int, ids)))


def load_tokenizer(
    spec: str | os.PathLike, *, bos: str | None = None, eos: str | None = None
) -> Tokenizer:
    """The tokenizer `spec` names: `bytes`, or a tokenizer file (its kind read from its content).

    Args:
      bos, eos: override the BOS / EOS token by its text (``none``: no BOS); default: the
        tokenizer's own (see the module docstring).

    Raises:
      TieraxError: the file is missing, unreadable, of no known kind, its package is not
        installed (the message names the pip command), or it has no EOS token.
    """
    if str(spec) == "bytes":
        if bos not in (None, "none") or eos not in (None, "none"):
            raise TieraxError(
                "--bos/--eos do not apply to the byte-level tokenizer (it has no special tokens); "
                "give a tokenizer file with --tokenizer"
            )
        return ByteTokenizer()
    if eos == "none":  # every kind: documents are separated by an end-of-text token
        raise TieraxError(EOS_NONE)
    path = pathlib.Path(spec)
    kind = detect_kind(path)
    cls = {
        "huggingface": HuggingFaceTokenizer,
        "sentencepiece": SentencePieceTokenizer,
        "tiktoken": TiktokenTokenizer,
    }[kind]
    try:
        return cls(path, bos, eos)
    except OSError as e:
        raise TieraxError(
            f"tokenizer file {str(path)!r} cannot be read ({e.strerror or e})"
        ) from None
