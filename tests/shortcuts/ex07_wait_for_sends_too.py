# shortcut: one batch, but every request waited, the sends' too, before returning
# graded as: ex07_pipeline_exchange.py
# scores: at most 5
# message: waited for its sends
import torch.distributed as dist


def exchange(sends, recvs, group=None):
    ops = [dist.P2POp(dist.isend, tensor, peer, group) for tensor, peer in sends]
    ops += [dist.P2POp(dist.irecv, buffer, peer, group) for buffer, peer in recvs]
    if not ops:
        return []
    requests = dist.batch_isend_irecv(ops)
    for request in requests:
        request.wait()
    return requests[:len(sends)]
