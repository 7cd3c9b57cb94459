"""The executor: the same schedule object, run on real ranks.

Each rank holds the chunks of the small GPT that the schedule gives it
(contiguous blocks; the embedding on the first virtual stage, the final
layer norm, the head and the loss on the last). It walks its action list:

* ``F``: receive the activation from the stage before (the first stage reads
  the tokens), run the chunk forward, send the output to the stage after (the
  last stage computes the micro-batch's loss instead);
* ``B``: receive the gradient of the output from the stage after, run the
  backward, send the gradient of the input to the stage before. With a split
  backward (ZB-H1), ``B`` computes only the input gradient (the graph is
  kept) and ``W`` then computes the weight gradients;
* ``W``: the weight gradients of a micro-batch.

:func:`exchange` is the one place where an activation or a gradient travels
to a neighbouring stage. The sends an action produces are posted together
with the receives the next action needs, in one ``batch_isend_irecv``, so
where both directions meet (1F1B's steady state: send an activation forward,
receive a gradient back) they travel in one batch, as Megatron-LM and
``torch.distributed.pipelining`` do. The executor waits for its receives at
once and for its sends at the end of the step, so a send never blocks: any
schedule :func:`~.schedules.validate` accepts runs without deadlock.
(On NCCL a batched send may complete only together with its receive; GPipe,
1F1B and ZB-H1 also pass ``validate(schedule, synchronous_sends=True)`` and are
safe then, Megatron's interleaved order is not: Megatron-LM runs it with every
rank exchanging in lock-step. Not yet run on GPUs.)

Every action's start and end is recorded (``metrics.Timer``; times from a
barrier at the start of the step). In *fixed-cost mode* (``cost=(t_forward,
t_backward, t_weight)`` in seconds per stage and micro-batch) each action's
compute is replaced by a wait of exactly its simulated cost
(:func:`~.simulate.action_costs`), while activation- and gradient-shaped tensors
still travel between the ranks as the schedule says: the measured timeline
shows the schedule itself even when 4 ranks share 2 cores (a sleeping rank
takes no core from the others). Real-compute mode (``cost=None``) trains.

The micro-batch losses are the full-batch mean: each is divided by ``m``, and
the gradients accumulate over micro-batches, so loss and gradients equal
one-process training on the whole batch.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import launch
from ..metrics import Timer, saved_tensor_bytes
from ..models import GPT, GPTConfig, MarkovText, TrainResult, lm_loss, make_optimizer
from .schedules import Schedule, make_schedule
from .simulate import action_costs


# ----------------------------------------------------------------------------
# Stages of the small GPT
# ----------------------------------------------------------------------------

class PipelineChunk(nn.Module):
    """Contiguous blocks of a :class:`~lecture_lib.models.GPT`, sharing its modules.

    Parameter names are the full model's (``blocks.3.attn.q.weight``), so the
    chunks of all ranks together compare one to one with the one-process model.
    """

    def __init__(self, gpt: GPT, layers: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in layers})
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        if self.first:
            x = GPT.embed(self, x)
        for block in self.blocks.values():
            x = block(x)
        return GPT.logits(self, x) if self.last else x


def check_split(n_layers: int, num_stages: int, chunks: int = 1) -> None:
    """Clear error unless ``n_layers`` splits into ``num_stages * chunks`` equal chunks."""
    parts = num_stages * chunks
    if parts > n_layers:
        raise ValueError(f"more pipeline stages than layers: {num_stages} stages x {chunks} "
                         f"chunks = {parts} model chunks, but the model has {n_layers} layers")
    if n_layers % parts:
        raise ValueError(f"{n_layers} layers do not split evenly into {num_stages} stages x "
                         f"{chunks} chunks: n_layers must be a multiple of {parts}")


def split_gpt(gpt: GPT, num_stages: int, chunks: int = 1) -> list[PipelineChunk]:
    """The model's virtual stages, in order (``num_stages * chunks`` of them)."""
    n = gpt.cfg.n_layers
    check_split(n, num_stages, chunks)
    parts, size = num_stages * chunks, n // (num_stages * chunks)
    return [PipelineChunk(gpt, range(s * size, (s + 1) * size), s == 0, s == parts - 1)
            for s in range(parts)]


def check_pipeline(cfg: GPTConfig, schedule: Schedule, batch_size: int) -> None:
    """Every check that can be made before a process starts."""
    check_split(cfg.n_layers, schedule.num_stages, schedule.chunks)
    m = schedule.num_microbatches
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number >= 1, not {batch_size!r}")
    if batch_size % m:
        raise ValueError(f"a batch of {batch_size} does not divide into {m} equal "
                         f"micro-batches: batch_size must be a multiple of {m}")


def nap_until(deadline: float, nap: float = 0.0005) -> None:
    """Sleep until ``deadline`` (a ``time.perf_counter()`` value) in short naps. One long
    ``time.sleep`` oversleeps by the wake-up latency of an idle CPU on every fixed-cost
    action (about 1.1 ms on the course's 2-core VM); short naps cut that to about 0.4 ms."""
    while (rest := deadline - time.perf_counter()) > 0:
        time.sleep(min(rest, nap))


def check_cost(cost) -> tuple[float, float, float] | None:
    if cost is None:
        return None
    cost = tuple(cost) + (0.0,) * (3 - len(tuple(cost)))
    if len(cost) != 3 or any(not isinstance(c, (int, float)) or c < 0 for c in cost):
        raise ValueError(f"cost must be (t_forward, t_backward[, t_weight]) in seconds >= 0, "
                         f"not {cost!r}")
    return cost


# ----------------------------------------------------------------------------
# Sending to the neighbouring stage
# ----------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------
# The executor
# ----------------------------------------------------------------------------

@dataclass
class StepRecord:
    """What one rank saw in one step."""
    stage: int
    loss: float | None                  # the batch's mean loss (last stage), else None
    timeline: list                      # [(kind, start_s, end_s, label), ...]
    peak_activation_bytes: int          # saved-tensor bytes held at once
    activation_bytes: dict = field(default_factory=dict)   # label -> bytes saved by its F
    waits: list = field(default_factory=list)   # [(label, posted_s, received_s)]: its receives
    clock: tuple = ("", 0.0)            # (host, perf_counter at the step's time 0)


class PipelineExecutor:
    """Runs ``schedule`` on this rank's ``chunks`` (chunk c = virtual stage c*p + stage).

    ``ranks`` (or ``group``) lists the global ranks of the stages in order; the
    default is every rank of the default group.
    """

    def __init__(self, chunks: list[nn.Module], schedule: Schedule,
                 activation_shape: tuple, *, ranks: list[int] | None = None, group=None,
                 cost=None, exchange=exchange, dtype=torch.float32):
        if group is not None and ranks is None:
            ranks = dist.get_process_group_ranks(group)
        self.ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
        if len(self.ranks) != schedule.num_stages:
            raise ValueError(f"{len(self.ranks)} ranks for {schedule.num_stages} stages")
        self.stage = self.ranks.index(dist.get_rank())
        if len(chunks) != schedule.chunks:
            raise ValueError(f"rank holds {len(chunks)} chunks, schedule has {schedule.chunks}")
        self.chunks, self.schedule, self.group = list(chunks), schedule, group
        self.shape, self.dtype = tuple(activation_shape), dtype
        self.cost = check_cost(cost)
        self.exchange = exchange
        self.device = launch.device()
        self._zeros = torch.zeros(self.shape, dtype=dtype, device=self.device)

    def _peer(self, stage: int) -> int:
        return self.ranks[self.schedule.rank_of(stage)]

    def _send(self, tensor, to: int, key: tuple, pending: list, local: dict) -> None:
        """Queue ``tensor`` for virtual stage ``to`` (a hand-off if this rank holds it)."""
        if self._peer(to) == dist.get_rank():
            local[key] = tensor
        else:
            pending.append((tensor, self._peer(to)))

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> StepRecord:
        """Forward and backward of one batch; gradients accumulate in the chunks."""
        sched, m = self.schedule, self.schedule.num_microbatches
        last = sched.num_virtual_stages - 1
        xs = inputs.to(self.device).chunk(m)
        ys = targets.to(self.device).chunk(m)
        costs = (action_costs(sched, *self.cost) if self.cost else None)
        inp, out, grad, local = {}, {}, {}, {}
        held, labels, saved, waits = {}, [], {}, []
        peak, loss, pending, send_works = 0, 0.0, [], []
        timer = Timer(self.device)
        dist.barrier(group=self.group)
        timer.reset()
        for a in sched.actions[self.stage]:
            s, key = sched.stage(self.stage, a.chunk), (a.microbatch, a.chunk)
            recvs = []
            if a.kind == "F" and s > 0:
                if self._peer(s - 1) == dist.get_rank():
                    inp[key] = local.pop(("F", a.microbatch, s - 1))
                else:
                    inp[key] = torch.empty(self.shape, dtype=self.dtype, device=self.device)
                    recvs.append((inp[key], self._peer(s - 1)))
            if a.kind == "B" and s < last:
                if self._peer(s + 1) == dist.get_rank():
                    grad[key] = local.pop(("B", a.microbatch, s + 1))
                else:
                    grad[key] = torch.empty(self.shape, dtype=self.dtype, device=self.device)
                    recvs.append((grad[key], self._peer(s + 1)))
            if pending or recvs:
                posted = time.perf_counter() - timer.t0
                send_works += self.exchange(pending, recvs, self.group)
                pending = []
                if recvs:
                    waits.append((str(a), posted, time.perf_counter() - timer.t0))
            with timer(a.kind):
                began = time.perf_counter()
                chunk = self.chunks[a.chunk]
                if costs:                                 # fixed cost: wait, send placeholders
                    nap_until(began + costs[a.kind])
                    if a.kind == "F" and s < last:
                        self._send(self._zeros, s + 1, ("F", a.microbatch, s), pending, local)
                    if a.kind == "B" and s > 0:
                        self._send(self._zeros, s - 1, ("B", a.microbatch, s), pending, local)
                elif a.kind == "F":
                    x = xs[a.microbatch] if s == 0 else inp[key].requires_grad_()
                    inp[key] = x
                    with saved_tensor_bytes() as counter:
                        y = chunk(x)
                        if s == last:
                            y = lm_loss(y, ys[a.microbatch]) / m
                    out[key] = y
                    held[key] = saved[str(a)] = counter.activation_bytes(chunk)
                    peak = max(peak, sum(held.values()))
                    if s == last:
                        loss += y.item()
                    else:
                        self._send(y.detach(), s + 1, ("F", a.microbatch, s), pending, local)
                elif a.kind == "B":
                    g = None if s == last else grad.pop(key)
                    if sched.split_backward:              # input gradient only; keep the graph
                        gx = (torch.autograd.grad(out[key], [inp[key]], g, retain_graph=True)[0]
                              if s > 0 else None)
                        grad[key] = g
                    else:
                        torch.autograd.backward(out[key], g)
                        gx = inp[key].grad if s > 0 else None
                        del out[key], inp[key], held[key]
                    if gx is not None:
                        self._send(gx, s - 1, ("B", a.microbatch, s), pending, local)
                else:                                     # W: the weight gradients
                    torch.autograd.backward(out.pop(key), grad.pop(key),
                                            inputs=list(chunk.parameters()))
                    del inp[key], held[key]
            labels.append(str(a))
        send_works += self.exchange(pending, [], self.group)
        for w in send_works:
            w.wait()
        timeline = [(k, start, end, label) for (k, start, end), label in zip(timer.spans, labels)]
        holds_loss = not costs and any(sched.stage(self.stage, c) == last
                                       for c in range(sched.chunks))
        return StepRecord(self.stage, loss if holds_loss else None, timeline, peak, saved, waits,
                          (socket.gethostname(), timer.t0))


# ----------------------------------------------------------------------------
# Training with a pipeline: the rank function and the caller's entry point
# ----------------------------------------------------------------------------

def train_stage(schedule: Schedule, cfg: GPTConfig, batch_size: int, steps: int = 1, *,
                lr: float = 1e-2, optimizer: str = "adamw", seed: int = 0, data_seed: int = 0,
                cost=None, ranks=None, group=None, exchange=exchange) -> dict:
    """On each rank of the pipeline: train its stage for ``steps`` steps of MarkovText.

    Returns ``losses`` (last stage; else empty), this rank's ``params`` after
    training and ``grads`` of the first step (by full-model name), and the
    :class:`StepRecord` of every step.
    """
    check_pipeline(cfg, schedule, batch_size)
    gpt = GPT(cfg, seed).to(launch.device())
    parts = split_gpt(gpt, schedule.num_stages, schedule.chunks)
    stage_ranks = (list(ranks) if ranks is not None else
                   dist.get_process_group_ranks(group) if group is not None else
                   list(range(dist.get_world_size())))
    stage = stage_ranks.index(dist.get_rank())
    chunks = [parts[schedule.stage(stage, c)] for c in range(schedule.chunks)]
    shape = (batch_size // schedule.num_microbatches, cfg.seq_len, cfg.d_model)
    executor = PipelineExecutor(chunks, schedule, shape, ranks=stage_ranks, group=group,
                                cost=cost, exchange=exchange)
    params = [p for c in chunks for p in c.parameters()]
    opt = make_optimizer(params, optimizer, lr)
    data = MarkovText(cfg.vocab_size, cfg.seq_len, seed=data_seed)
    losses, records, grads = [], [], {}
    for step in range(steps):
        x, y = data.batch(step, batch_size)
        opt.zero_grad(set_to_none=True)
        record = executor.step(x, y)
        if step == 0:
            grads = {n: p.grad.detach().cpu().clone() for c in chunks
                     for n, p in c.named_parameters() if p.grad is not None}
        opt.step()
        records.append(record)
        if record.loss is not None:
            losses.append(record.loss)
    return {"losses": losses, "records": records, "grads": grads,
            "params": {n: p.detach().cpu().clone() for c in chunks
                       for n, p in c.named_parameters()}}


@dataclass
class PipelineRun:
    """The merged results of every rank (see :func:`train`)."""
    schedule: Schedule
    losses: list[float]
    params: dict
    grads: dict
    timelines: list                 # per step: {rank: [(kind, start, end, label), ...]}
    peak_activation_bytes: list     # per rank, the largest over steps
    latencies: list = field(default_factory=list)   # per step: mean message delay (s)

    def as_train_result(self) -> TrainResult:
        return TrainResult(self.losses, self.params)


def aligned(records: list[StepRecord]) -> dict:
    """The ranks' timelines of one step on one time axis, ``{rank: spans}``.

    Ranks on one host share ``perf_counter`` (Linux's monotonic clock), so their
    spans are shifted onto the earliest rank's time 0; ranks on several hosts keep
    the barrier at the start of the step as their common time 0.
    """
    return {rank: [(k, a + shift, b + shift, *rest) for k, a, b, *rest in rec.timeline]
            for (rank, rec), shift in zip(enumerate(records), _shifts(records))}


def _shifts(records: list[StepRecord]) -> list[float]:
    hosts = {rec.clock[0] for rec in records}
    if len(hosts) > 1:
        return [0.0] * len(records)
    t0 = min(rec.clock[1] for rec in records)
    return [rec.clock[1] - t0 for rec in records]


def message_latency(schedule: Schedule, records: list[StepRecord]) -> float:
    """Mean measured delay of a message its receiver was already waiting for: from the
    end of the sending action to the moment the receiver has the data (seconds)."""
    shifts = _shifts(records)
    ends = {(rank, label): end + shift for (rank, rec), shift in zip(enumerate(records), shifts)
            for _, _, end, label in rec.timeline}
    actions = {str(a): a for acts in schedule.actions for a in acts}
    delays = []
    for rank, (rec, shift) in enumerate(zip(records, shifts)):
        for label, posted, got in rec.waits:
            a = actions[label]
            s = schedule.stage(rank, a.chunk)
            src = s - 1 if a.kind == "F" else s + 1
            if not 0 <= src < schedule.num_virtual_stages:
                continue
            sent = ends.get((schedule.rank_of(src), str(type(a)(a.kind, a.microbatch,
                                                                 schedule.chunk_of(src)))))
            if sent is not None and posted + shift <= sent:
                delays.append(got + shift - sent)
    return sum(delays) / len(delays) if delays else 0.0


def merge(schedule: Schedule, results: list[dict]) -> PipelineRun:
    """Combine the per-rank dicts of :func:`train_stage` (in stage order)."""
    losses = next((r["losses"] for r in results if r["losses"]), [])
    params = {k: v for r in results for k, v in r["params"].items()}
    grads = {k: v for r in results for k, v in r["grads"].items()}
    steps = len(results[0]["records"])
    timelines = [aligned([r["records"][i] for r in results]) for i in range(steps)]
    peaks = [max(rec.peak_activation_bytes for rec in r["records"]) for r in results]
    latencies = [message_latency(schedule, [r["records"][i] for r in results])
                 for i in range(steps)]
    return PipelineRun(schedule, losses, params, grads, timelines, peaks, latencies)


def train(cfg: GPTConfig, schedule: Schedule | str, num_stages: int | None = None,
          num_microbatches: int | None = None, *, batch_size: int, steps: int = 1,
          chunks: int = 1, lr: float = 1e-2, optimizer: str = "adamw", seed: int = 0,
          data_seed: int = 0, cost=None, timeout: float = 120.0) -> PipelineRun:
    """Train the GPT with a pipeline on ``num_stages`` fresh ranks (checked first).

    >>> run = train(GPTConfig(n_layers=4), "1f1b", 2, 4, batch_size=8, steps=2)
    >>> run.losses, run.timelines[-1][0][:2]
    """
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, num_stages, num_microbatches, chunks)
    check_pipeline(cfg, schedule, batch_size)
    check_cost(cost)
    results = launch.run(train_stage, schedule.num_stages, schedule, cfg, batch_size, steps,
                         lr=lr, optimizer=optimizer, seed=seed, data_seed=data_seed, cost=cost,
                         timeout=timeout)
    return merge(schedule, results)


def _train_many(schedules, cfg, batch_size, steps, kwargs):
    return [train_stage(s, cfg, batch_size, steps, **kwargs) for s in schedules]


def train_many(cfg: GPTConfig, schedules: list[Schedule], *, batch_size: int, steps: int = 1,
               timeout: float = 180.0, **kwargs) -> list[PipelineRun]:
    """:func:`train` for several schedules of one pipeline depth, in one call of the ranks
    (a warm call costs milliseconds, a cold start of 4 ranks seconds)."""
    if not schedules:
        raise ValueError("no schedules given")
    depths = {s.num_stages for s in schedules}
    if len(depths) != 1:
        raise ValueError(f"every schedule must have the same number of stages, not {depths}")
    for s in schedules:
        check_pipeline(cfg, s, batch_size)
    check_cost(kwargs.get("cost"))
    per_rank = launch.run(_train_many, depths.pop(), list(schedules), cfg, batch_size, steps,
                          kwargs, timeout=timeout)
    return [merge(s, [r[i] for r in per_rank]) for i, s in enumerate(schedules)]
