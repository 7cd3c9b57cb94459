"""The capstone (issue 18): train a GPT-2 on real text with every strategy, survive a failure,
and predict the GPU run before making it (issue 34).

Data (``corpus``, ``tokenizer``, ``tokens``): the interpreter's standard library source split
by file, a byte-level BPE tokenizer trained on it, memory-mapped token files, cached in
``build/capstone/``. Training (``loader``, ``strategies``, ``train``, ``checkpoint``): a
resumable loader that shards each global batch over the data-parallel ranks, one trainer for
every strategy, distributed checkpoints that resume bit-exactly and reshard. Prediction and
comparison (``predict``, ``report``, ``compare``): every strategy's step of GPT-2 small on
emulated GPUs in the dry run, the record a run writes (measured or predicted), and
``python -m lecture_lib.capstone compare`` to set them side by side.
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
from .predict import predict, predict_strategies, strategy_layout
from .report import FIELDS, format_table, run_record
from .tokenizer import EOT, cache_folder, eot_id, train_tokenizer
from .tokens import TokenFiles, build_token_files, load_tokens
from .train import STRATEGIES, TrainConfig, check_config, cpu_gpt, gpt2_small, train, train_on_rank

__all__ = [
    "DEFAULT_RUNS", "compare_strategies", "kill_and_resume", "loss_gaps", "resume_and_reshard",
    "EOT", "FIELDS", "STRATEGIES", "Corpus", "TokenFiles", "TokenLoader", "TrainConfig",
    "build_token_files", "cache_folder", "check_config", "corpus_files", "cpu_gpt", "eot_id",
    "format_table", "gpt2_small", "latest_checkpoint", "load_tokens", "predict",
    "predict_strategies", "read_text", "run_record", "split_corpus", "stdlib_root",
    "strategy_layout", "train", "train_on_rank", "train_tokenizer",
]
