# shortcut: fixes one bug: every gradient all-reduced (biases too), but summed and the loss local
# graded as: ex11_fix_ddp_step.py
# scores: at most 4
# message: 3 times one process's
import torch.distributed as dist


def train_step(model, optimizer, x, y) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
    optimizer.step()
    return loss.item()
