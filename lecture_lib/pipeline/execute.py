"""The executor: the same schedule object, run on real ranks.

Each rank holds the chunks of the small GPT that the schedule gives it
(:func:`~.stage.split_gpt`). It walks its action list, and every action is
one named step:

* **receive** what the action needs: ``F`` the activation from the stage
  before (the first stage reads the tokens), ``B`` the gradient of the output
  from the stage after (the last stage starts from its loss);
* **forward** (``F``): run the chunk; the last stage computes the
  micro-batch's loss, the others **send** the output to the stage after;
* **backward** (``B``): the gradient of the input, **sent** to the stage
  before. Without a split backward this is the whole backward; with one
  (ZB-H1, Qi et al. 2024) only the input gradient, the graph is kept, and
* **weight gradient** (``W``) then computes the gradients of the weights.

:func:`exchange` is the one place where an activation or a gradient travels
to a neighbouring stage. The sends an action produces are posted together
with the receives the next action needs, in one ``batch_isend_irecv``, so
where both directions meet (1F1B's steady state: send an activation forward,
receive a gradient back) they travel in one batch, as Megatron-LM and
``torch.distributed.pipelining`` do. The executor waits for its receives at
once and for its sends at the end of the step, so a send never blocks: any
schedule :func:`~.validate.validate` accepts runs without deadlock.
(On NCCL a batched send may complete only together with its receive; GPipe,
1F1B and ZB-H1 also pass ``validate(schedule, synchronous_sends=True)`` and are
safe then, Megatron's interleaved order is not: Megatron-LM runs it with every
rank exchanging in lock-step.)

The micro-batch losses are the full-batch mean: each is divided by ``m``, and
the gradients accumulate over micro-batches, so loss and gradients equal
one-process training on the whole batch.

The executor measures nothing. Timelines, message delays and activation
bytes come from a :class:`~.recorder.StepRecorder` the caller passes to
:meth:`PipelineExecutor.step`; the fixed-cost mode of the notebooks is
:class:`~.experiments.FixedCostExecutor`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from ..comm import maybe
from ..models import lm_loss
from ..runtime import launch
from .actions import Schedule
from .recorder import StepRecord


def exchange(sends, recvs, group=None) -> list:
    """Post ``sends`` [(tensor, peer)] and ``recvs`` [(buffer, peer)] as one batch of
    isend/irecv; return when every buffer is filled, with the sends' requests (the
    caller waits for them before it reuses or frees those tensors). Peers are
    global ranks."""
    ops = [dist.P2POp(dist.isend, t, peer, group) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, group) for t, peer in recvs]
    if not ops:
        return []
    works = dist.batch_isend_irecv(ops)
    if len(works) != len(ops):          # a backend that returns one request for the batch
        for w in works:
            w.wait()
        return []
    for w in works[len(sends):]:
        w.wait()
    return works[:len(sends)]


@dataclass
class _Step:
    """What one step keeps between its actions, by ``(microbatch, chunk)``."""
    xs: tuple                                       # the micro-batches' tokens
    ys: tuple                                       # and targets
    inputs: dict = field(default_factory=dict)      # a chunk's input (requires grad)
    outputs: dict = field(default_factory=dict)     # its output (the loss on the last stage)
    grads: dict = field(default_factory=dict)       # the gradient of its output
    local: dict = field(default_factory=dict)       # hand-offs between chunks of this rank
    pending: list = field(default_factory=list)     # sends to post with the next exchange
    sent: list = field(default_factory=list)        # their requests, waited for at the end
    loss: torch.Tensor | None = None


class PipelineExecutor:
    """Runs ``schedule`` on this rank's ``chunks`` (chunk c = virtual stage c*pp + stage).

    ``ranks`` (or ``group``) lists the global ranks of the stages in order; the
    default is every rank of the default group. ``exchange`` moves the messages
    (exercise 07 writes it).
    """

    def __init__(self, chunks: list[nn.Module], schedule: Schedule,
                 activation_shape: tuple, *, ranks: list[int] | None = None, group=None,
                 exchange=exchange, dtype=torch.float32):
        if group is not None and ranks is None:
            ranks = dist.get_process_group_ranks(group)
        self.ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
        if len(self.ranks) != schedule.num_stages:
            raise ValueError(f"{len(self.ranks)} ranks for {schedule.num_stages} stages")
        self.rank = dist.get_rank()
        self.stage = self.ranks.index(self.rank)
        if len(chunks) != schedule.chunks:
            raise ValueError(f"rank holds {len(chunks)} chunks, schedule has {schedule.chunks}")
        self.chunks, self.schedule, self.group = list(chunks), schedule, group
        self.shape, self.dtype = tuple(activation_shape), dtype
        self.exchange = exchange
        self.device = launch.device()
        self.last = schedule.num_virtual_stages - 1
        self.run_action = {"F": self.forward, "B": self.backward, "W": self.weight_gradient}

    # -- the schedule loop --------------------------------------------------------

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, recorder=None) -> StepRecord:
        """Forward and backward of one batch; gradients accumulate in the chunks.

        ``recorder`` (a :class:`~.recorder.StepRecorder`, optional) records the step.
        """
        m = self.schedule.microbatches
        st = _Step(inputs.to(self.device).chunk(m), targets.to(self.device).chunk(m))
        if recorder is not None:
            recorder.start(self.schedule, self.group)
        for a in self.schedule.actions[self.stage]:
            self.receive(a, st, recorder)
            with maybe(recorder.action(a, self.chunks[a.chunk]) if recorder else None):
                self.run_action[a.kind](a, st)
        self.finish(st)
        loss = None if st.loss is None else st.loss.item()
        return (recorder.record(self.stage, loss) if recorder is not None
                else StepRecord(self.stage, loss))

    # -- the named steps ----------------------------------------------------------

    def receive(self, a, st: _Step, recorder=None) -> None:
        """Post the pending sends with the receive ``a`` needs; wait for the receive."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        recvs = []
        if a.kind == "F" and s > 0:
            st.inputs[key] = self._incoming(("F", a.microbatch, s - 1), s - 1, recvs, st)
        elif a.kind == "B" and s < self.last:
            st.grads[key] = self._incoming(("B", a.microbatch, s + 1), s + 1, recvs, st)
        if not (st.pending or recvs):
            return
        with maybe(recorder.receiving(a) if recorder is not None and recvs else None):
            st.sent += self.exchange(st.pending, recvs, self.group)
        st.pending = []

    def forward(self, a, st: _Step) -> None:
        """``F``: the chunk's forward; the loss on the last stage, else send the output."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        x = st.xs[a.microbatch] if s == 0 else st.inputs[key].requires_grad_()
        st.inputs[key] = x
        y = self.chunks[a.chunk](x)
        if s == self.last:
            y = lm_loss(y, st.ys[a.microbatch]) / self.schedule.microbatches
            st.loss = y.detach() if st.loss is None else st.loss + y.detach()
        else:
            self.send(y.detach(), s + 1, ("F", a.microbatch, s), st)
        st.outputs[key] = y

    def backward(self, a, st: _Step) -> None:
        """``B``: the input gradient, sent to the stage before (the whole backward
        unless the schedule splits off ``W``)."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        g = None if s == self.last else st.grads.pop(key)
        if self.schedule.split_backward:                # input gradient only; keep the graph
            gx = (torch.autograd.grad(st.outputs[key], [st.inputs[key]], g,
                                      retain_graph=True)[0] if s > 0 else None)
            st.grads[key] = g
        else:
            torch.autograd.backward(st.outputs.pop(key), g)
            x = st.inputs.pop(key)
            gx = x.grad if s > 0 else None
        if gx is not None:
            self.send(gx, s - 1, ("B", a.microbatch, s), st)

    def weight_gradient(self, a, st: _Step) -> None:
        """``W``: the gradients of the chunk's weights (kept graph, saved output gradient)."""
        key = (a.microbatch, a.chunk)
        torch.autograd.backward(st.outputs.pop(key), st.grads.pop(key),
                                inputs=list(self.chunks[a.chunk].parameters()))
        del st.inputs[key]

    def send(self, tensor, to: int, key: tuple, st: _Step) -> None:
        """Queue ``tensor`` for virtual stage ``to`` (a hand-off if this rank holds it);
        it leaves with the next exchange."""
        peer = self.ranks[self.schedule.rank_of(to)]
        if peer == self.rank:
            st.local[key] = tensor
        else:
            st.pending.append((tensor, peer))

    def finish(self, st: _Step) -> None:
        """Post the last sends and wait for every send of the step."""
        st.sent += self.exchange(st.pending, [], self.group)
        st.pending = []
        for w in st.sent:
            w.wait()

    def _incoming(self, key: tuple, source: int, recvs: list, st: _Step) -> torch.Tensor:
        peer = self.ranks[self.schedule.rank_of(source)]
        if peer == self.rank:
            return st.local.pop(key)
        buffer = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        recvs.append((buffer, peer))
        return buffer
