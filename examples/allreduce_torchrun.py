"""The same rank function under lecture_lib.run and under torchrun.

    torchrun --standalone --nproc-per-node=2 examples/allreduce_torchrun.py
    python -c "import lecture_lib, examples.allreduce_torchrun as e; \
               print(lecture_lib.run(e.sum_of_ranks_plus_one, 2))"

On a cluster, give torchrun --nnodes, --node-rank and --rdzv-endpoint instead of --standalone.
"""
import torch
import torch.distributed as dist

import lecture_lib
from lecture_lib.runtime import torchrun_main


def sum_of_ranks_plus_one() -> float:
    t = torch.tensor([dist.get_rank() + 1.0], device=lecture_lib.device())
    dist.all_reduce(t)
    return t.item()


if __name__ == "__main__":
    torchrun_main(sum_of_ranks_plus_one)
