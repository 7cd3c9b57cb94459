"""The corpus as token files: one memory-mapped array of token ids per split.

Training reads tokens, not text: as nanoGPT does, we encode every file once, write the
ids of a split into one flat binary file (each file's tokens followed by the end-of-text
token, files in sorted order) and open it with ``numpy.memmap``. A data loader then cuts
windows out of it at any offset without reading the file into memory or decoding again,
and every rank of a job can map the same file. The ids fit in ``uint16`` while the
vocabulary has at most 65536 tokens (half the bytes of ``int32``), else ``uint32``.

Beside the two ``.bin`` files a small ``meta.json`` records what they hold: vocabulary
size, dtype, end-of-text id, token counts, the files and their token counts, and the
key of the tokenizer they were encoded with. The folder is named after that key, so the
files are built once per corpus slice and vocabulary and then loaded in milliseconds.

From a shell (before a multi-rank job, so that the ranks only load)::

    python -m lecture_lib.capstone.tokens --vocab-size 4096            # the whole corpus
    python -m lecture_lib.capstone.tokens --vocab-size 1024 --max-bytes 1000000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from .corpus import Corpus, read_text, split_corpus
from .tokenizer import (
    cache_folder,
    check_vocab_size,
    eot_id,
    tokenizer_key,
    tokenizer_path,
    train_tokenizer,
)

FORMAT = 1  # bump when the layout of the token files changes
SPLITS = ("train", "val")


@dataclass(frozen=True)
class TokenFiles:
    """Where a corpus slice's token files are, and what they hold."""

    train: Path
    val: Path
    vocab_size: int  # the tokenizer's real size (may be below the size asked for)
    eot: int  # the end-of-text id written after each file
    meta: dict
    tokenizer: Path  # the tokenizer's JSON file

    def load_tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.tokenizer))


def dtype_for(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a `vocab_size` vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 2 ** 16 else np.dtype(np.uint32)


def encode_files(tok: Tokenizer, paths: tuple[Path, ...]) -> list[list[int]]:
    """Each file's token ids (no end-of-text token)."""
    return [enc.ids for enc in tok.encode_batch([read_text(p) for p in paths])]


def _write_split(folder: Path, name: str, per_file: list[list[int]], eot: int,
                 dtype: np.dtype) -> int:
    stream = [token for ids in per_file for token in (*ids, eot)]
    array = np.asarray(stream, dtype=dtype)
    array.tofile(folder / f"{name}.bin")
    return int(array.size)


def _build(folder: Path, corpus: Corpus, tok: Tokenizer, key: str, tok_path: Path) -> None:
    """Encode both splits into a temporary folder, then rename it into place (atomic)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + "."))
    vocab, eot = tok.get_vocab_size(), eot_id(tok)
    dtype = dtype_for(vocab)
    meta = {"format": FORMAT, "vocab_size": vocab, "dtype": dtype.name, "eot": eot,
            "source_hash": corpus.fingerprint, "tokenizer_key": key,
            "tokenizer": tok_path.name, "corpus_root": str(corpus.root),
            "tokens_per_file": {}, "files": {}}
    for name, paths in zip(SPLITS, (corpus.train, corpus.val)):
        per_file = encode_files(tok, paths)
        meta[f"{name}_tokens"] = _write_split(tmp, name, per_file, eot, dtype)
        meta[f"{name}_files"] = len(paths)
        meta[f"{name}_bytes"] = sum(p.stat().st_size for p in paths)
        meta["tokens_per_file"][name] = [len(ids) for ids in per_file]
        meta["files"][name] = [p.relative_to(corpus.root).as_posix() for p in paths]
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    try:
        os.replace(tmp, folder)
    except OSError:  # another process built it first: keep theirs (same content)
        shutil.rmtree(tmp, ignore_errors=True)


def build_token_files(vocab_size: int = 4096, max_bytes: int | None = None,
                      cache_dir: str | Path | None = None, val_fraction: float = 0.05,
                      seed: int = 0) -> TokenFiles:
    """Train (or load) the tokenizer and encode both splits (or load the cached files)."""
    check_vocab_size(vocab_size)
    corpus = split_corpus(max_bytes=max_bytes, val_fraction=val_fraction, seed=seed)
    key = tokenizer_key(corpus, vocab_size)
    folder = cache_folder(cache_dir) / f"tokens-{key}-f{FORMAT}"
    tok_path = tokenizer_path(corpus, vocab_size, cache_dir)
    if not (folder / "meta.json").is_file() or not tok_path.is_file():
        tok = train_tokenizer(vocab_size, cache_dir=cache_dir, corpus=corpus)
        _build(folder, corpus, tok, key, tok_path)
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    return TokenFiles(folder / "train.bin", folder / "val.bin", meta["vocab_size"],
                      meta["eot"], meta, tok_path)


def load_tokens(path: str | Path) -> np.memmap:
    """A token file as a read-only memory map (dtype from the ``meta.json`` beside it)."""
    path = Path(path)
    meta_path = path.parent / "meta.json"
    if not path.is_file() or not meta_path.is_file():
        raise ValueError(f"{path} is not a token file written by build_token_files")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")


def main(argv: list[str] | None = None) -> dict:
    """Build (or find) the token files and print what they hold."""
    parser = argparse.ArgumentParser(prog="python -m lecture_lib.capstone.tokens",
                                     description=main.__doc__)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-bytes", type=int, default=None, help="a slice (default: all)")
    parser.add_argument("--cache-dir", default=None, help="default: build/capstone")
    args = parser.parse_args(argv)
    tf = build_token_files(args.vocab_size, args.max_bytes, args.cache_dir)
    summary = {k: v for k, v in tf.meta.items() if k.endswith(("_tokens", "_files", "_bytes"))}
    summary.update(vocab_size=tf.vocab_size, dtype=tf.meta["dtype"], train=str(tf.train),
                   val=str(tf.val), tokenizer=str(tf.tokenizer))
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
