# shortcut: each rank steps on its own gradients, then the parameters are averaged (right for SGD)
# graded as: ex11_fix_ddp_step.py
# scores: at most 7
# message: differs on rank
import torch
import torch.distributed as dist


def train_step(model, optimizer, x, y) -> float:
    size = dist.get_world_size()
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p)
            p /= size
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / size
