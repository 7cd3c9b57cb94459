"""The capstone (issue 18): train a GPT-2 on real text with every strategy.

Data side: the corpus (the interpreter's standard library source, split by file), a
byte-level BPE tokenizer trained on it, and memory-mapped token files, all cached in
``build/capstone/``.
"""
from .corpus import Corpus, corpus_files, read_text, split_corpus, stdlib_root
from .tokenizer import EOT, cache_folder, eot_id, train_tokenizer
from .tokens import TokenFiles, build_token_files, load_tokens

__all__ = [
    "EOT", "Corpus", "TokenFiles", "build_token_files", "cache_folder", "corpus_files",
    "eot_id", "load_tokens", "read_text", "split_corpus", "stdlib_root", "train_tokenizer",
]
