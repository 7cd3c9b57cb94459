# Generated from solutions/ex07_pipeline_exchange.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex07_pipeline_exchange.py
"""Exercise 07: the executor's step that sends an activation forward and a
gradient back.

Between two actions a pipeline rank has messages to send (the activation its
forward produced, for the next stage; the input gradient its backward
produced, for the stage before) and messages to receive (what its next action
needs). Write ``exchange(sends, recvs, group)``:

* ``sends``: a list of ``(tensor, peer)``: send ``tensor`` to global rank ``peer``;
* ``recvs``: a list of ``(buffer, peer)``: receive from ``peer`` into ``buffer``;
* post them all at once as one batch of non-blocking operations
  (``dist.P2POp(dist.isend, tensor, peer, group)``, ``dist.P2POp(dist.irecv, ...)``,
  then ``dist.batch_isend_irecv``), so that where both directions meet (send
  an activation forward while receiving a gradient back from the same
  neighbour) neither rank waits for the other to go first;
* wait until every receive has completed (the next action reads the buffers);
* do NOT wait for the sends: return their requests (a list); the executor
  waits for them at the end of the step. A send that waited for its receiver
  could deadlock a schedule in which the receiver first needs something else.
* with nothing to send or receive, return ``[]`` without calling torch.

The tests record, on each rank, the messages ``exchange`` posts and the requests
it waits for, in order: every message posted before the first wait, a wait on
each receive, none on a send.

Every rank of :class:`lecture_lib.pipeline.PipelineExecutor` calls it before
each action (``PipelineExecutor(..., exchange=exchange)``); the tests train
the GPT through the pipeline with yours and compare with one process.
"""
import torch.distributed as dist


def exchange(sends, recvs, group=None) -> list:
    raise NotImplementedError("ex07: your code here")
