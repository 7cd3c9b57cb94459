# shortcut: gradients and values compared element by element, but only the weights (biases skipped)
# graded as: ex10_gradient_consistency.py
# scores: at most 7
# message: bias
import torch
import torch.distributed as dist


def first_inconsistent(model: torch.nn.Module, atol: float = 1e-6):
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            continue
        for kind in ("grad", "value"):
            mine = p.detach() if kind == "value" else p.grad
            mine = torch.zeros_like(p) if mine is None else mine.detach()
            ref = mine.clone()
            dist.broadcast(ref, 0)
            diff = (mine - ref).abs().max().reshape(1).float()
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
            if diff.item() > atol:
                return name, kind, diff.item()
    return None
