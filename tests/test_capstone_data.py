"""The capstone's data: stdlib corpus split by file, BPE tokenizer, cached token files.

Small on purpose (a 150 kB slice, a 512-token vocabulary): the whole module takes a few
seconds, most of it training the tokenizer twice.
"""
import json

import numpy as np
import pytest

from lecture_lib.capstone import (
    EOT,
    build_token_files,
    cache_folder,
    corpus_files,
    load_tokens,
    read_text,
    split_corpus,
    stdlib_root,
    train_tokenizer,
)
from lecture_lib.capstone import tokenizer as tokenizer_module
from lecture_lib.capstone.tokens import main

MAX_BYTES = 150_000
VOCAB = 512


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("capstone_cache")


@pytest.fixture(scope="module")
def token_files(cache):
    return build_token_files(vocab_size=VOCAB, max_bytes=MAX_BYTES, cache_dir=cache)


def test_corpus_is_the_stdlib_without_tests_or_packages():
    files = corpus_files()
    assert files == sorted(files) and len(files) > 100
    for path in files:
        parts = set(path.relative_to(stdlib_root()).parts)
        assert not parts & {"site-packages", "dist-packages", "test", "tests", "idlelib"}
        assert path.suffix == ".py" and path.stat().st_size > 0


def test_split_is_deterministic_by_file_and_sized():
    full, again = split_corpus(), split_corpus()
    assert full == again
    assert not set(full.train) & set(full.val)
    assert set(full.train) | set(full.val) == set(corpus_files())
    assert 0.01 < len(full.val) / len(full.files) < 0.15  # val_fraction=0.05 of the files
    small = split_corpus(max_bytes=MAX_BYTES)
    assert small == split_corpus(max_bytes=MAX_BYTES)
    assert small.train_bytes + small.val_bytes <= MAX_BYTES
    assert small.train and small.val and not set(small.train) & set(small.val)
    # a file's side does not depend on the slice: the slice's files keep their side
    assert set(small.train) <= set(full.train) and set(small.val) <= set(full.val)
    assert list(small.train) == sorted(small.train)
    other_seed = split_corpus(seed=1)
    assert set(other_seed.val) != set(full.val)
    assert small.fingerprint != full.fingerprint != other_seed.fingerprint


def test_tokenizer_round_trip_is_exact(token_files, cache):
    tok = train_tokenizer(VOCAB, max_bytes=MAX_BYTES, cache_dir=cache)
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id(EOT) == token_files.eot
    corpus = split_corpus(max_bytes=MAX_BYTES)
    odd = "def f(x):\n\tréturn  x  # ünïcode → 表 \r\n\n   trailing   \n"
    for text in [read_text(p) for p in corpus.val[:3]] + [odd]:  # unseen files too
        ids = tok.encode(text).ids
        assert len(ids) < len(text.encode())  # the merges compress real text
        assert tok.decode(ids) == text


def test_cache_hit_loads_without_retraining(token_files, cache, monkeypatch):
    first = train_tokenizer(VOCAB, max_bytes=MAX_BYTES, cache_dir=cache)

    def refuse(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again instead of loaded")

    monkeypatch.setattr(tokenizer_module, "_train", refuse)
    again = train_tokenizer(VOCAB, max_bytes=MAX_BYTES, cache_dir=cache)
    assert again.get_vocab() == first.get_vocab()
    assert build_token_files(VOCAB, max_bytes=MAX_BYTES, cache_dir=cache) == token_files
    with pytest.raises(AssertionError, match="trained again"):  # another size is a miss
        train_tokenizer(VOCAB + 1, max_bytes=MAX_BYTES, cache_dir=cache)


def test_training_is_deterministic(cache, tmp_path):
    a = train_tokenizer(VOCAB, max_bytes=MAX_BYTES, cache_dir=cache)
    b = train_tokenizer(VOCAB, max_bytes=MAX_BYTES, cache_dir=tmp_path)  # trained afresh
    assert a.to_str() == b.to_str()


def test_token_files_hold_the_encoding(token_files):
    tok = token_files.load_tokenizer()
    corpus = split_corpus(max_bytes=MAX_BYTES)
    meta = json.loads((token_files.train.parent / "meta.json").read_text())
    assert meta == token_files.meta and meta["dtype"] == "uint16"
    assert meta["source_hash"] == corpus.fingerprint
    for name, paths in (("train", corpus.train), ("val", corpus.val)):
        expected = [t for p in paths for t in (*tok.encode(read_text(p)).ids, token_files.eot)]
        array = load_tokens(getattr(token_files, name))
        assert isinstance(array, np.memmap) and array.dtype == np.uint16
        assert array.tolist() == expected
        assert meta[f"{name}_tokens"] == len(expected)
        assert sum(meta["tokens_per_file"][name]) == len(expected) - len(paths)  # no EOT
        assert meta[f"{name}_files"] == len(paths) == int((array == token_files.eot).sum())
    assert token_files.vocab_size == VOCAB


def test_cache_folder_override(monkeypatch, tmp_path):
    monkeypatch.setenv("LECTURE_CAPSTONE_CACHE", str(tmp_path))
    assert cache_folder() == tmp_path
    assert cache_folder(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("LECTURE_CAPSTONE_CACHE")
    assert cache_folder().parts[-2:] == ("build", "capstone")


@pytest.mark.parametrize("kwargs, error", [
    ({"vocab_size": 257}, ValueError), ({"vocab_size": 100}, ValueError),
    ({"vocab_size": 2 ** 32}, ValueError), ({"vocab_size": 1024.0}, TypeError),
    ({"max_bytes": 0}, ValueError), ({"max_bytes": -5}, ValueError),
    ({"max_bytes": 1.5e5}, TypeError), ({"max_bytes": 10}, ValueError),  # empty split
    ({"val_fraction": 0.0}, ValueError), ({"val_fraction": 1.0}, ValueError),
])
def test_bad_input_is_rejected(kwargs, error, tmp_path):
    with pytest.raises(error):
        build_token_files(**{"vocab_size": VOCAB, "cache_dir": tmp_path, **kwargs})
    assert not any(tmp_path.iterdir())  # nothing trained or written


def test_load_tokens_rejects_other_files(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0\0")
    with pytest.raises(ValueError, match="not a token file"):
        load_tokens(tmp_path / "x.bin")


def test_command_line_builds_the_same_files(token_files, cache, capsys):
    summary = main(["--vocab-size", str(VOCAB), "--max-bytes", str(MAX_BYTES),
                    "--cache-dir", str(cache)])
    assert summary["train"] == str(token_files.train)
    assert json.loads(capsys.readouterr().out)["train_tokens"] == token_files.meta["train_tokens"]
