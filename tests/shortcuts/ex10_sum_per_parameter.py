# shortcut: compares each gradient's and value's sum (a checksum) with rank 0's, not its elements
# graded as: ex10_gradient_consistency.py
# scores: at most 6
# message: element by element
import torch
import torch.distributed as dist


def first_inconsistent(model: torch.nn.Module, atol: float = 1e-6):
    for name, p in model.named_parameters():
        for kind in ("grad", "value"):
            t = p.detach() if kind == "value" else p.grad
            mine = torch.zeros(1) if t is None else t.detach().sum().reshape(1).float()
            ref = mine.clone()
            dist.broadcast(ref, 0)
            diff = (mine - ref).abs()
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
            if diff.item() > atol:
                return name, kind, diff.item()
    return None
