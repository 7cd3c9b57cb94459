# shortcut: fixes two bugs: every gradient averaged; still returns this rank's own loss
# graded as: ex11_fix_ddp_step.py
# scores: at most 7
# message: the returned losses
import torch.distributed as dist


def train_step(model, optimizer, x, y) -> float:
    size = dist.get_world_size()
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= size
    optimizer.step()
    return loss.item()
