"""Train the course's GPT on the Python standard library with any parallel strategy.

    torchrun --standalone --nproc-per-node=2 examples/train_gpt2.py --strategy fsdp
    torchrun --standalone --nproc-per-node=2 --max-restarts=1 examples/train_gpt2.py \
        --strategy ddp --checkpoint-dir /tmp/ckpt --checkpoint-every 5 --fail-at 7 --fail-rank 1
    torchrun --standalone --nproc-per-node=8 examples/train_gpt2.py --model gpt2 \
        --strategy 3d --tp 2 --pp 2 --microbatches 4 --batch 32 --steps 200
    python examples/train_gpt2.py --strategy tp --tp 2        # starts its ranks itself

The restart needs no TORCH_DISABLE_SHARE_RDZV_TCP_STORE: the process group is keyed by
torchrun's restart count (PyTorch issue 135712), and a rank that waits longer than --timeout
seconds says for what and exits (lecture_lib/capstone/elastic.py).
On several nodes give torchrun --nnodes, --node-rank and --rdzv-endpoint instead of
--standalone. Every option: ``python examples/train_gpt2.py --help``
(lecture_lib/capstone/cli.py).
"""
from lecture_lib.capstone.cli import main

if __name__ == "__main__":
    main()
