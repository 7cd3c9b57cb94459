# shortcut: each isend and irecv posted on its own (no batch_isend_irecv); receives waited
# graded as: ex07_pipeline_exchange.py
# scores: at most 7
# message: before posting all its messages
import torch.distributed as dist


def exchange(sends, recvs, group=None):
    requests = [dist.isend(tensor, peer, group) for tensor, peer in sends]
    for buffer, peer in recvs:
        dist.irecv(buffer, peer, group).wait()
    return requests
