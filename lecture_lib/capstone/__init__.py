"""The capstone (issue 18): train a GPT-2 on real text with every strategy, survive a failure.

Data (``corpus``, ``tokenizer``, ``tokens``): the interpreter's standard library source split
by file, a byte-level BPE tokenizer trained on it, memory-mapped token files, cached in
``build/capstone/``. Training (``loader``, ``strategies``, ``train``, ``checkpoint``): a
resumable loader that shards each global batch over the data-parallel ranks, one trainer for
every strategy, distributed checkpoints that resume bit-exactly and reshard.
"""
from .checkpoint import latest_checkpoint
from .corpus import Corpus, corpus_files, read_text, split_corpus, stdlib_root
from .experiments import (
                          DEFAULT_RUNS,
                          compare_strategies,
                          kill_and_resume,
                          loss_gaps,
                          resume_and_reshard,
)
from .loader import TokenLoader
from .tokenizer import EOT, cache_folder, eot_id, train_tokenizer
from .tokens import TokenFiles, build_token_files, load_tokens
from .train import STRATEGIES, TrainConfig, check_config, cpu_gpt, gpt2_small, train, train_on_rank

__all__ = [
    "DEFAULT_RUNS", "compare_strategies", "kill_and_resume", "loss_gaps", "resume_and_reshard",
    "EOT", "STRATEGIES", "Corpus", "TokenFiles", "TokenLoader", "TrainConfig",
    "build_token_files", "cache_folder", "check_config", "corpus_files", "cpu_gpt", "eot_id",
    "gpt2_small", "latest_checkpoint", "load_tokens", "read_text", "split_corpus",
    "stdlib_root", "train", "train_on_rank", "train_tokenizer",
]
