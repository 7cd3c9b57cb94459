# shortcut: correct another way: the loss divided by the world size before backward, the sums kept
# graded as: ex11_fix_ddp_step.py
# scores: full
import torch.distributed as dist


def train_step(model, optimizer, x, y) -> float:
    size = dist.get_world_size()
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y) / size
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item()
