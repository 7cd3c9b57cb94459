# shortcut: blocking sends, then blocking receives, one at a time; nothing returned
# graded as: ex07_pipeline_exchange.py
# scores: at most 1
# message: never returned
import torch.distributed as dist


def exchange(sends, recvs, group=None):
    for tensor, peer in sends:
        dist.send(tensor, peer, group)
    for buffer, peer in recvs:
        dist.recv(buffer, peer, group)
    return []
