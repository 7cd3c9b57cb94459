"""A byte-level BPE tokenizer trained on the capstone corpus, cached on disk.

Byte-pair encoding (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with
Subword Units") starts from an alphabet and repeatedly merges the most frequent adjacent
pair into a new token until the vocabulary has the size asked for. GPT-2 (Radford et al.
2019) runs it on *bytes*: the 256 byte values are the alphabet, so every string encodes
(no unknown token) and decoding gives back the exact text, whitespace and all. A regular
expression first splits the text into words, numbers, punctuation runs and spaces, so a
merge never crosses their boundaries. ``<|endoftext|>`` separates documents (files here).

We do not write BPE ourselves: Hugging Face ``tokenizers`` (Rust, multi-threaded) trains
a vocabulary of a few thousand tokens on a few MB in about a second. GPT-2 used 50257
tokens on 40 GB of web text; for a ~10 MB corpus of Python a vocabulary of 4096 already
gives most common identifiers a token of their own, and a small vocabulary keeps the
embedding table (vocab x d parameters) from dominating a small CPU model. On a small
corpus the trainer can stop early, with fewer tokens than asked for: read the size from
``tokenizer.get_vocab_size()``, never from the argument.

The trained tokenizer is saved as JSON in the build folder (``build/capstone/`` of the
repository, ``$LECTURE_CAPSTONE_CACHE`` or the ``cache_dir`` argument), under a name
derived from the corpus files, the vocabulary size and the library version, so a second
call loads it in milliseconds and any change of the inputs trains a new one.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .corpus import Corpus, read_text, split_corpus

EOT = "<|endoftext|>"
SPECIAL_TOKENS = (EOT,)
MIN_VOCAB = 256 + len(SPECIAL_TOKENS) + 1  # the bytes, the specials and at least one merge
FORMAT = 1  # bump when the way a tokenizer is built changes: old caches are then ignored
CACHE_ENV = "LECTURE_CAPSTONE_CACHE"


def cache_folder(cache_dir: str | Path | None = None) -> Path:
    """Argument, else $LECTURE_CAPSTONE_CACHE, else <repository>/build/capstone."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    repo = Path(__file__).resolve().parents[2]
    base = repo if (repo / "pyproject.toml").is_file() else Path.cwd()
    return base / "build" / "capstone"


def check_vocab_size(vocab_size: int) -> None:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if not MIN_VOCAB <= vocab_size < 2 ** 32:
        raise ValueError(f"vocab_size must be in [{MIN_VOCAB}, 2**32) (256 bytes, "
                         f"{len(SPECIAL_TOKENS)} special token(s), one merge), got {vocab_size}")


def tokenizer_key(corpus: Corpus, vocab_size: int) -> str:
    """The cache key: corpus files and split, vocabulary size, library and format version."""
    text = f"{corpus.fingerprint}:{vocab_size}:{tokenizers.__version__}:{FORMAT}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def new_tokenizer() -> Tokenizer:
    """An untrained GPT-2-style byte-level BPE: byte alphabet, GPT-2 split regex."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _train(corpus: Corpus, vocab_size: int) -> Tokenizer:
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((read_text(p) for p in corpus.train), trainer,
                            length=len(corpus.train))
    return tok


def save_atomic(text: str, path: Path) -> None:
    """Write `text` to `path` through a temporary file, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def tokenizer_path(corpus: Corpus, vocab_size: int, cache_dir: str | Path | None = None) -> Path:
    return cache_folder(cache_dir) / f"tokenizer-{tokenizer_key(corpus, vocab_size)}.json"


def train_tokenizer(vocab_size: int = 4096, max_bytes: int | None = None,
                    cache_dir: str | Path | None = None, corpus: Corpus | None = None,
                    ) -> Tokenizer:
    """The BPE tokenizer of `corpus` (default ``split_corpus(max_bytes)``), from the cache
    when it was trained before, else trained on the training files and cached."""
    check_vocab_size(vocab_size)
    corpus = corpus if corpus is not None else split_corpus(max_bytes=max_bytes)
    path = tokenizer_path(corpus, vocab_size, cache_dir)
    if path.is_file():
        return Tokenizer.from_file(str(path))
    tok = _train(corpus, vocab_size)
    save_atomic(tok.to_str(), path)
    return tok


def eot_id(tok: Tokenizer) -> int:
    """The id of the end-of-text token that separates files."""
    return tok.token_to_id(EOT)
