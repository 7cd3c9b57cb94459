# shortcut: one batch, nothing waited: receives may not have landed when the next action reads
# graded as: ex07_pipeline_exchange.py
# scores: at most 5
# message: did not wait for its receives
import torch.distributed as dist


def exchange(sends, recvs, group=None):
    ops = [dist.P2POp(dist.isend, tensor, peer, group) for tensor, peer in sends]
    ops += [dist.P2POp(dist.irecv, buffer, peer, group) for buffer, peer in recvs]
    if not ops:
        return []
    return dist.batch_isend_irecv(ops)[:len(sends)]
