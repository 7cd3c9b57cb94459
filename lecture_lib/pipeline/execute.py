"""The executor: a schedule (:mod:`.schedules`) run on real ranks.

Each rank holds its chunks of the GPT (:func:`~.stage.split_gpt`; chunk c of rank r is
virtual stage c * pp + r) and walks its list of actions. Before each action, one
:func:`exchange` posts the messages the previous action produced together with the
receive this action needs, in one ``batch_isend_irecv``: where both directions meet
(1F1B's steady state sends an activation forward while a gradient comes back) they
travel in one batch, as in Megatron-LM and ``torch.distributed.pipelining``::

    for action in my actions:
        recvs = what action needs       # F: the activation from the stage before
                                        # B: the gradient from the stage after
        exchange(sends, recvs)          # post both; wait for the receives only
        sends = action()                # F sends its output on, B its input gradient back

A rank waits for its receives at once and for its sends at the end of the step, so a send
never blocks and any schedule :func:`~.validate.validate` accepts runs without deadlock.
The micro-batch losses are divided by m and the gradients accumulate, so loss and
gradients equal one-process training on the whole batch. The executor measures nothing:
it marks each action and each exchange for whoever watches (:mod:`lecture_lib.observe`;
:class:`~.recorder.StepRecorder` turns that into a timeline).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import observe
from ..models import lm_loss
from ..runtime import launch
from .actions import Action, Schedule
from .split_backward import input_gradient, layer_outputs, weight_gradients


def exchange(sends: list, recvs: list, group=None) -> list:
    """Post ``sends`` [(tensor, peer)] and ``recvs`` [(buffer, peer)] as one batch of
    isend/irecv; return when every buffer is filled, with the sends' requests (the
    caller waits for them before it reuses or frees those tensors). Peers are
    global ranks."""
    ops = [dist.P2POp(dist.isend, t, peer, group) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, group) for t, peer in recvs]
    if not ops:
        return []
    requests = dist.batch_isend_irecv(ops)
    if len(requests) != len(ops):       # a backend that returns one request for the batch
        for r in requests:
            r.wait()
        return []
    for r in requests[len(sends):]:
        r.wait()
    return requests[:len(sends)]


class PipelineExecutor:
    """Runs ``schedule`` on this rank's ``chunks``; ``ranks`` (or ``group``) lists the
    global ranks of the stages in order (default: every rank). ``exchange`` moves the
    messages (exercise 07 writes it); ``loss_fn(logits, targets)`` turns the last stage's
    output into the mean loss (tensor parallelism's vocabulary-parallel loss takes logits
    split over the vocabulary)."""

    def __init__(self, chunks: list[nn.Module], schedule: Schedule, activation_shape: tuple,
                 *, ranks: list[int] | None = None, group=None, exchange=exchange,
                 dtype=torch.float32, loss_fn=lm_loss):
        if group is not None and ranks is None:
            ranks = dist.get_process_group_ranks(group)
        self.ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
        if len(self.ranks) != schedule.num_stages:
            raise ValueError(f"{len(self.ranks)} ranks for {schedule.num_stages} stages")
        if len(chunks) != schedule.chunks:
            raise ValueError(f"rank holds {len(chunks)} chunks, schedule has {schedule.chunks}")
        self.rank = dist.get_rank()
        self.stage = self.ranks.index(self.rank)
        self.chunks, self.schedule, self.group = list(chunks), schedule, group
        self.shape, self.dtype = tuple(activation_shape), dtype
        self.exchange, self.loss_fn = exchange, loss_fn
        self.device = launch.device()
        self.last = schedule.num_virtual_stages - 1
        # a split backward (ZB-H1) runs B as the input gradient only, and W after it
        self.run = {"F": self.forward, "W": self.weight_gradient,
                    "B": self.input_gradient if schedule.split_backward else self.backward}

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of one batch; the gradients accumulate in the chunks.
        Returns the batch's mean loss (a tensor, on the last stage; else None)."""
        m = self.schedule.microbatches
        work = _Work(inputs.to(self.device).chunk(m), targets.to(self.device).chunk(m))
        sends = []
        for a in self.schedule.actions[self.stage]:
            recvs = self.receives(a, work)
            with observe.span("exchange", self.device, action=a, receives=len(recvs)):
                work.sent += self.exchange(sends, recvs, self.group)
            with observe.span(a.kind, self.device, action=a):
                sends = self.run[a.kind](a, work)
        work.sent += self.exchange(sends, [], self.group)
        for request in work.sent:
            request.wait()
        return work.loss

    # -- the actions: each returns the messages it sends, [(tensor, peer)] -------------

    def forward(self, a: Action, work: _Work) -> list:
        """``F``: the chunk's forward; the loss on the last stage, else send the output on."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        x = work.xs[a.microbatch] if s == 0 else work.inputs[key].requires_grad_()
        work.inputs[key] = x
        chunk = self.chunks[a.chunk]
        if self.schedule.split_backward:            # W will need every layer's output
            with layer_outputs(chunk) as layers:
                y = chunk(x)
            work.layers[key] = layers
        else:
            y = chunk(x)
        if s == self.last:
            y = self.loss_fn(y, work.ys[a.microbatch]) / self.schedule.microbatches
            work.loss = y.detach() if work.loss is None else work.loss + y.detach()
        work.outputs[key] = y
        return [] if s == self.last else self.send(y.detach(), s + 1, ("F", a.microbatch, s),
                                                   work)

    def backward(self, a: Action, work: _Work) -> list:
        """``B``: the whole backward; the input gradient goes to the stage before."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        grad = None if s == self.last else work.grads.pop(key)
        torch.autograd.backward(work.outputs.pop(key), grad)
        x = work.inputs.pop(key)
        return [] if s == 0 else self.send(x.grad, s - 1, ("B", a.microbatch, s), work)

    def input_gradient(self, a: Action, work: _Work) -> list:
        """``B`` of a split backward: the input gradient only, sent to the stage before;
        every layer's output gradient is kept for ``W`` (:mod:`.split_backward`)."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        grad = None if s == self.last else work.grads.pop(key)
        x = work.inputs[key] if s > 0 else None
        dx, work.layer_grads[key] = input_gradient(work.outputs[key], grad, x, work.layers[key])
        return [] if s == 0 else self.send(dx, s - 1, ("B", a.microbatch, s), work)

    def weight_gradient(self, a: Action, work: _Work) -> list:
        """``W``: the weight gradients, from the layers' output gradients ``B`` kept."""
        key = (a.microbatch, a.chunk)
        weight_gradients(work.layers.pop(key), work.layer_grads.pop(key))
        del work.outputs[key], work.inputs[key]
        return []

    # -- where messages come from and go to ------------------------------------------

    def receives(self, a: Action, work: _Work) -> list:
        """The receive ``a`` needs, [(buffer, peer)]: F the activation of the stage before,
        B the gradient of the stage after; [] on the first/last stage or for a hand-off
        from a chunk of this rank."""
        s, key = self.schedule.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
        if a.kind == "F" and s > 0:
            source, into, sent_as = s - 1, work.inputs, ("F", a.microbatch, s - 1)
        elif a.kind == "B" and s < self.last:
            source, into, sent_as = s + 1, work.grads, ("B", a.microbatch, s + 1)
        else:
            return []
        peer = self.ranks[self.schedule.rank_of(source)]
        if peer == self.rank:
            into[key] = work.local.pop(sent_as)
            return []
        into[key] = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return [(into[key], peer)]

    def send(self, tensor: torch.Tensor, to: int, sent_as: tuple, work: _Work) -> list:
        """``[(tensor, peer)]`` for virtual stage ``to``; ``[]`` when this rank holds it
        (the tensor is handed over in memory)."""
        peer = self.ranks[self.schedule.rank_of(to)]
        if peer == self.rank:
            work.local[sent_as] = tensor
            return []
        return [(tensor, peer)]


@dataclass
class _Work:
    """What one step keeps between its actions, by ``(microbatch, chunk)``."""
    xs: tuple                                       # the micro-batches' tokens
    ys: tuple                                       # and targets
    inputs: dict = field(default_factory=dict)      # a chunk's input (requires grad)
    outputs: dict = field(default_factory=dict)     # its output (the loss on the last stage)
    grads: dict = field(default_factory=dict)       # the gradient of its output
    layers: dict = field(default_factory=dict)      # split backward: its layers' outputs
    layer_grads: dict = field(default_factory=dict)  # and their gradients, from B for W
    local: dict = field(default_factory=dict)       # hand-offs between chunks of this rank
    sent: list = field(default_factory=list)        # send requests, waited for at the end
    loss: torch.Tensor | None = None
