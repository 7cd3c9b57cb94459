"""Profiling distributed training: where does a step's time go, on every rank?

The idea
--------
A slow distributed job is slow for one of a few reasons, and a profiler
trace tells them apart (PyTorch profiler recipe, "Profiling your PyTorch
module"; HTA, "Holistic Trace Analysis", Meta 2023; the Ultra-Scale
Playbook's profiling chapter):

* **communication** takes a large share of the step (look at all-reduce
  efficiency: message sizes, bucketing, overlap with the backward pass);
* the **device is idle** much of the step (the batch is too small to keep it
  busy, the host cannot launch work fast enough, or a pipeline has bubbles).

:func:`profile_steps` runs a training step under ``torch.profiler`` with its
*wait / warm-up / active* schedule (the first steps are skipped, the next
warm the profiler up, the last are recorded), writes one Chrome trace per
rank (open it in https://ui.perfetto.dev or chrome://tracing) and reduces
the trace to a few numbers. :func:`profile_run` does this on N ranks.

Which events count as what:

* **communication**: on a GPU the NCCL kernels (``ncclDevKernel_AllReduce...``)
  on the device timeline; on the CPU (gloo) a collective from the moment the
  training thread hands it over (``c10d::allreduce_``) until gloo's thread has
  executed it (``gloo:all_reduce``, ``gloo:send``...), see :func:`comm_intervals`.
* **busy** (useful work): on a GPU any other kernel or copy on the device; on
  the CPU any other operator (``cpu_op``). The rest of a step is waiting or
  idle: Python between operators, a pipeline bubble (which a trace shows as a
  stage waiting inside ``recv``), a slow peer.

Shares are the length of the *union* of those intervals over the recorded
steps, divided by the recorded steps' length, so nested and overlapping events
are counted once. The communication share from the trace is cross-checked
with :class:`lecture_lib.metrics.Timer` phases when the step times its own
communication (:attr:`RankProfile.timer_comm_share`).

:func:`diagnose` applies the lecture's rules of thumb to those measured
shares; :func:`timeline` turns a trace into spans for
:func:`lecture_lib.plots.plot_timeline`. :func:`data_parallel_step` (torch's
DDP, or a hand-written sync in one or many messages) and
:func:`two_stage_pipeline_step` are the workloads notebook 08 profiles.
"""
from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .metrics import Timer

# Names of communication events: NCCL kernels, gloo's executions, c10d calls.
COMM_PATTERN = re.compile(
    r"nccl|gloo:|c10d::|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
    r"\bsend\b|\brecv\b|barrier", re.IGNORECASE)

# After a blocking collective ends, the training thread's next operator within this many
# seconds counts as the moment it resumed (the wait and the wake-up are not trace events).
_RESUME_SLACK = 0.05

# The rules of thumb of the lecture ("common problems and debugging").
COMM_SHARE_LIMIT = 0.30
BUSY_SHARE_LIMIT = 0.70


@dataclass
class Event:
    """One complete event of a trace; times in seconds from the first recorded step."""
    name: str
    kind: str          # "comm", "compute" or "step"
    start: float
    end: float
    thread: str
    device: bool = False    # a GPU kernel or copy (device timeline) rather than a CPU event


@dataclass
class RankProfile:
    """What :func:`profile_steps` measured on one rank."""
    rank: int
    steps: list[tuple[float, float]]          # the recorded (active) steps, seconds
    events: list[Event]
    comm_share: float                         # from the trace
    busy_share: float                         # from the trace
    table: str                                # torch.profiler's key_averages table
    trace_path: str | None = None
    timer_totals: dict = field(default_factory=dict)   # metrics.Timer over the same steps
    timer_spans: list = field(default_factory=list)    # its (phase, start, end) spans

    @property
    def step_seconds(self) -> float:
        """Mean length of a recorded step."""
        return sum(e - s for s, e in self.steps) / len(self.steps)

    @property
    def timer_comm_share(self) -> float | None:
        """Seconds in the timer's "comm" phase over the recorded steps' length (None if untimed).

        The trace's :attr:`comm_share` counts each collective from its hand-over to
        its end (for a blocking one, to the moment the training thread resumes);
        the timer counts the training thread's whole "comm" phase, which also holds
        the Python around the call and any time the operating system preempted the
        thread inside the phase. So the timer never reads less, and on a quiet
        machine the two agree.
        """
        if "comm" not in self.timer_totals:
            return None
        return self.timer_totals["comm"] / sum(e - s for s, e in self.steps)

    def step_comm_shares(self) -> list[tuple[float, float | None]]:
        """Per recorded step: ``(comm share from the trace, comm share from the timer)``.

        The timer's "comm" spans are split evenly over the steps (the step must
        enter ``timer("comm")`` the same number of times in every step), else the
        timer's entry is None. Step by step, a preemption by the operating system
        inside the timed phase shows up in one step, not smeared over all.
        """
        comm = comm_intervals(self.events)
        spans = [e - s for phase, s, e in self.timer_spans if phase == "comm"]
        per = len(spans) // len(self.steps) if len(spans) % len(self.steps) == 0 else 0
        out = []
        for k, (s, e) in enumerate(self.steps):
            timed = sum(spans[k * per:(k + 1) * per]) / (e - s) if per else None
            out.append((covered(comm, [(s, e)]) / (e - s), timed))
        return out


# ----------------------------------------------------------------------------
# Reading a trace
# ----------------------------------------------------------------------------

def classify(name: str, category: str | None = None) -> str | None:
    """'step', 'comm', 'compute' or None (an event that is neither work nor a step)."""
    if name.startswith("ProfilerStep#"):
        return "step"
    if COMM_PATTERN.search(name):
        return "comm"
    if category in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset"):
        return "compute"
    return None


def read_trace(trace) -> tuple[list[Event], list[tuple[float, float]]]:
    """Events and recorded steps of a Chrome trace (a path or the parsed JSON).

    Times become seconds from the start of the first recorded step. Works on any
    trace ``torch.profiler`` exports, on CPU or GPU.
    """
    if isinstance(trace, (str, os.PathLike)):
        with open(trace) as f:
            trace = json.load(f)
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    picked = []
    for e in raw:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        kind = classify(e["name"], e.get("cat"))
        if kind is not None:
            device = e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            picked.append((e["name"], kind, float(e["ts"]), float(e["ts"]) + float(e["dur"]),
                           str(e.get("tid")), device))
    steps = sorted((s, t) for _, kind, s, t, _, _ in picked if kind == "step")
    if not steps:
        raise ValueError("the trace holds no ProfilerStep# events: profile with a schedule "
                         "and call prof.step() after every training step")
    t0 = steps[0][0]
    events = [Event(n, k, (s - t0) * 1e-6, (t - t0) * 1e-6, th, d)
              for n, k, s, t, th, d in picked if k != "step"]
    return events, [((s - t0) * 1e-6, (t - t0) * 1e-6) for s, t in steps]


def merge(intervals, gap: float = 0.0) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals, joining those less than ``gap`` apart."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def covered(intervals, windows) -> float:
    """Seconds of ``windows`` covered by the union of ``intervals``."""
    union, total = merge(intervals), 0.0
    for ws, we in windows:
        for s, e in union:
            total += max(0.0, min(e, we) - max(s, ws))
    return total


def shares(events: list[Event], steps) -> tuple[float, float]:
    """``(comm_share, busy_share)`` of the recorded steps, from the trace's events.

    ``busy_share`` counts computation only (communication in flight is not useful
    work, even where it keeps a GPU "utilised"). When the trace holds device (GPU)
    events, both are read on the device timeline (collective kernels against the
    other kernels); otherwise on the CPU events.
    """
    span = sum(e - s for s, e in steps)
    if span <= 0:
        raise ValueError("the recorded steps have no length")
    on_device = any(e.device for e in events)
    work = [(e.start, e.end) for e in events if e.device == on_device and e.kind == "compute"]
    return covered(comm_intervals(events), steps) / span, covered(work, steps) / span


def overlap_share(profile: RankProfile) -> float:
    """Share of the recorded steps where communication is in flight *while* the rank computes.

    DDP launches each bucket's all-reduce as soon as its gradients are ready, so
    communication overlaps the rest of the backward pass (Li et al. 2020); a sync
    after the backward overlaps nothing.
    """
    on_device = any(e.device for e in profile.events)
    compute = merge((e.start, e.end) for e in profile.events
                    if e.device == on_device and e.kind == "compute")
    windows = [(max(s, ws), min(e, we)) for s, e in compute for ws, we in profile.steps
               if min(e, we) > max(s, ws)]
    return covered(comm_intervals(profile.events), windows) / sum(e - s for s, e in profile.steps)


def comm_intervals(events: list[Event]) -> list[tuple[float, float]]:
    """When communication is in flight, as ``(start, end)`` intervals.

    On a GPU: the collective kernels. On the CPU, gloo runs a collective on its
    own thread (``gloo:all_reduce``) after the training thread hands it over
    (``c10d::allreduce_``); the collective is in flight from the hand-over to the
    end of gloo's execution, so the i-th ``c10d::`` call is joined to the i-th
    ``gloo:`` execution (they run in the order issued). When the counts differ
    (a trace cut mid-collective), each event counts on its own.
    """
    if any(e.device for e in events):
        return [(e.start, e.end) for e in events if e.device and e.kind == "comm"]
    def op(name):                # "c10d::allreduce_" and "gloo:all_reduce" -> "allreduce"
        return name.split(":")[-1].strip("_").replace("_", "")

    handovers = [e for e in events if e.name.startswith("c10d::")]
    runs = [e for e in events if e.name.startswith("gloo:")]
    out = [(e.start, e.end) for e in events if e.kind == "comm"
           and not e.name.startswith(("c10d::", "gloo:"))]
    # A blocking collective holds the training thread until it resumes: its next
    # operator starts no earlier than the collective's end (the wait itself is not
    # an event). An asynchronous one (DDP's, an isend) lets the thread go on at once.
    threads = {e.thread for e in handovers}
    starts = sorted(e.start for e in events if e.thread in threads and e.kind == "compute")
    for kind in {op(e.name) for e in handovers + runs}:
        calls = sorted((e.start, e.end) for e in handovers if op(e.name) == kind)
        done = sorted((e.start, e.end) for e in runs if op(e.name) == kind)
        if len(calls) != len(done):
            out += calls + done
            continue
        for (c0, c1), (_, r1) in zip(calls, done):
            resume = next((t for t in starts if t >= c1), r1)
            out.append((c0, max(c1, r1, resume if resume <= r1 + _RESUME_SLACK else r1)))
    return out


# ----------------------------------------------------------------------------
# Profiling a step
# ----------------------------------------------------------------------------

def _check_schedule(wait: int, warmup: int, active: int) -> None:
    for name, value in (("wait", wait), ("warmup", warmup), ("active", active)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, not {value!r}")
    if active < 1:
        raise ValueError(f"active must be >= 1 (the steps that are recorded), not {active}")


@contextmanager
def _without_kineto_banner():
    """Drop the profiler library's "USDT: profiler_start/stop" lines from stderr.

    Everything else written to stderr inside the block is passed on at its end.
    """
    import sys
    import tempfile
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(True)
                    if not ln.startswith("USDT:")]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def profile_steps(step, *, wait: int = 1, warmup: int = 1, active: int = 3,
                  trace_dir: str | None = None, timer: Timer | None = None,
                  row_limit: int = 12) -> RankProfile:
    """Run ``step(i)`` for ``wait + warmup + active`` steps under ``torch.profiler``.

    Call it inside a rank function. ``timer``, when the step times its phases
    with it, is reset before the first recorded step so its totals cover the same
    steps as the trace. With ``trace_dir`` the trace is written to
    ``trace_dir/rank<r>.json``.
    """
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule
    _check_schedule(wait, warmup, active)
    if not callable(step):
        raise TypeError(f"step must be callable, not {type(step).__name__}")
    rank = dist.get_rank() if dist.is_initialized() else 0
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        activities.append(ProfilerActivity.CUDA)
    with _without_kineto_banner(), profile(
            activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active),
            on_trace_ready=lambda p: None) as prof:
        for i in range(wait + warmup + active):
            if timer is not None and i == wait + warmup:
                timer.reset()
            step(i)
            prof.step()
    if trace_dir is not None:
        os.makedirs(trace_dir, exist_ok=True)
        path = os.path.join(trace_dir, f"rank{rank}.json")
        prof.export_chrome_trace(path)
        events, steps = read_trace(path)
    else:
        import tempfile
        path = None
        with tempfile.TemporaryDirectory(prefix="lecture_trace_") as tmp:
            prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
            events, steps = read_trace(os.path.join(tmp, "trace.json"))
    comm, busy = shares(events, steps)
    sort_by = "self_cuda_time_total" if len(activities) > 1 else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)
    return RankProfile(rank, steps, events, comm, busy, table, path,
                       dict(timer.totals) if timer is not None else {},
                       list(timer.spans) if timer is not None else [])


def profile_run(make_step, world_size: int, *args, wait: int = 1, warmup: int = 1,
                active: int = 3, trace_dir: str | None = None, timeout: float = 120,
                **kwargs) -> list[RankProfile]:
    """Profile a step on ``world_size`` ranks; one :class:`RankProfile` per rank.

    ``make_step(timer, *args, **kwargs)`` runs on every rank, builds the model and
    returns ``step(i)``; the step may time its phases with ``timer`` (a
    :class:`lecture_lib.metrics.Timer` on the rank's device), e.g. ``with
    timer("comm"): ...``, for the cross-check with the trace.
    """
    from . import launch
    _check_schedule(wait, warmup, active)
    if not callable(make_step):
        raise TypeError(f"make_step must be callable, not {type(make_step).__name__}")

    def rank_fn():
        timer = Timer(launch.device())
        step = make_step(timer, *args, **kwargs)
        return profile_steps(step, wait=wait, warmup=warmup, active=active,
                             trace_dir=trace_dir, timer=timer)

    return launch.run(rank_fn, world_size, timeout=timeout)


# ----------------------------------------------------------------------------
# Reading the numbers: rules of thumb and timelines
# ----------------------------------------------------------------------------

@dataclass
class Diagnosis:
    comm_share: float
    busy_share: float
    comm_bound: bool
    underused: bool
    findings: list[str]

    def __str__(self):
        return "\n".join(self.findings)


def diagnose(comm_share: float, busy_share: float, *, comm_limit: float = COMM_SHARE_LIMIT,
             busy_limit: float = BUSY_SHARE_LIMIT) -> Diagnosis:
    """Apply the lecture's rules of thumb to measured shares and say what they show.

    * communication over 30% of the step: look at all-reduce efficiency (message
      sizes, bucketing) and at overlapping it with the backward pass;
    * device busy under 70% of the step: raise the batch (more work per launch and
      per message) or fix the pipeline (bubbles, a slow stage, host overhead).
    """
    for name, v in (("comm_share", comm_share), ("busy_share", busy_share),
                    ("comm_limit", comm_limit), ("busy_limit", busy_limit)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1], not {v!r}")
    comm_bound, underused = comm_share > comm_limit, busy_share < busy_limit
    findings = []
    if comm_bound:
        findings.append(f"communication takes {comm_share:.0%} of the step (> {comm_limit:.0%}): "
                        "look at all-reduce efficiency (bus bandwidth against the link's), "
                        "bucket gradients into fewer, larger messages and overlap them with "
                        "the backward pass")
    if underused:
        findings.append(f"the device is busy only {busy_share:.0%} of the step "
                        f"(< {busy_limit:.0%}): raise the batch size so each step has more "
                        "work per launch and per message, or fix the pipeline (bubbles, "
                        "a slow stage, host overhead between operators)")
    if not findings:
        findings.append(f"communication {comm_share:.0%} (<= {comm_limit:.0%}) and device busy "
                        f"{busy_share:.0%} (>= {busy_limit:.0%}): no rule of thumb fires")
    return Diagnosis(comm_share, busy_share, comm_bound, underused, findings)


def timeline(profile: RankProfile, gap: float = 50e-6) -> list[tuple[str, float, float]]:
    """Spans ``(kind, start_s, end_s)`` of one rank's recorded steps, for ``plot_timeline``.

    Compute and communication are each merged (events less than ``gap`` apart
    become one span); communication is listed last so it is drawn on top where it
    overlaps compute (as DDP's all-reduce overlaps the backward pass).
    """
    on_device = any(e.device for e in profile.events)
    end = profile.steps[-1][1]
    compute = [(e.start, e.end) for e in profile.events
               if e.device == on_device and e.kind == "compute"]
    spans = []
    for kind, intervals in (("compute", compute), ("comm", comm_intervals(profile.events))):
        spans += [(kind, s, min(e, end)) for s, e in merge(intervals, gap) if s < end]
    return spans


# ----------------------------------------------------------------------------
# Workloads to profile: ``make_step(timer, ...)`` factories for profile_run
# ----------------------------------------------------------------------------

def _small_gpt_setup(cfg, seed):
    from . import launch
    from .models import GPT, GPTConfig, MarkovText
    cfg = cfg or GPTConfig(d_model=64, n_layers=2, seq_len=32, n_heads=4)
    return cfg, GPT(cfg, seed).to(launch.device()), MarkovText(cfg.vocab_size, cfg.seq_len, seed)


def data_parallel_step(timer, batch_size: int = 16, sync: str = "ddp", cfg=None,
                       bucket_cap_mb: float = 25.0, lr: float = 0.1, seed: int = 0):
    """A data-parallel step of the small GPT on this rank's shard of the global batch.

    ``sync``: ``"ddp"`` (torch's DistributedDataParallel, gradients all-reduced in
    buckets of ``bucket_cap_mb`` while the backward pass runs), ``"flat"`` (one
    all-reduce of all gradients after the backward) or ``"per_param"`` (one
    all-reduce per gradient). For the hand-written syncs ``timer("comm")`` holds
    the all-reduces alone; DDP's overlap hides its communication from a timer, so
    only the trace can show it.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from . import launch
    from .models import shard
    if sync not in ("ddp", "flat", "per_param"):
        raise ValueError(f"sync must be 'ddp', 'flat' or 'per_param', not {sync!r}")
    rank, size = dist.get_rank(), dist.get_world_size()
    cfg, model, data = _small_gpt_setup(cfg, seed)
    params = list(model.parameters())
    net = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb) if sync == "ddp" else model
    opt = torch.optim.SGD(params, lr=lr)

    def step(i):
        x, y = (t.to(launch.device()) for t in shard(data.batch(i, batch_size), rank, size))
        with timer("compute"):
            net(x, y).backward()
        if sync == "flat":
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            with timer("comm"):
                dist.all_reduce(flat)
            torch.nn.utils.vector_to_parameters(flat / size, [p.grad for p in params])
        elif sync == "per_param":
            with timer("comm"):
                for p in params:
                    dist.all_reduce(p.grad)
            for p in params:
                p.grad /= size
        with timer("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step.model = model                              # for checks
    return step


def two_stage_pipeline_step(timer, batch_size: int = 16, micro_batches: int = 4, cfg=None,
                            lr: float = 0.1, seed: int = 0):
    """A hand-made two-stage pipeline (GPipe order: all forwards, then all backwards).

    Rank 0 holds the embeddings and the first half of the blocks, rank 1 the rest
    and the head. Activations go forward and their gradients back with
    send/recv, one micro-batch at a time (Huang et al. 2019, "GPipe"). A
    stand-in until the course's pipeline executor profiles itself.
    """
    import torch.distributed as dist
    from .models import lm_loss
    from . import launch
    if dist.get_world_size() != 2:
        raise ValueError(f"the two-stage pipeline needs 2 ranks, not {dist.get_world_size()}")
    if batch_size % micro_batches:
        raise ValueError(f"batch_size={batch_size} is not divisible by "
                         f"micro_batches={micro_batches}")
    rank, dev = dist.get_rank(), launch.device()
    cfg, model, data = _small_gpt_setup(cfg, seed)
    half = max(1, cfg.n_layers // 2)
    mine = model.blocks[:half] if rank == 0 else model.blocks[half:]
    params = ([model.tok_emb.weight, model.pos_emb.weight] if rank == 0 else
              list(model.ln_f.parameters()) + list(model.head.parameters()))
    params += [p for b in mine for p in b.parameters()]
    opt = torch.optim.SGD(params, lr=lr)
    shape = (batch_size // micro_batches, cfg.seq_len, cfg.d_model)

    def step(i):
        x, y = (t.to(dev) for t in data.batch(i, batch_size))
        pending = []
        if rank == 0:
            outs = []
            for xm in x.chunk(micro_batches):
                with timer("compute"):
                    h = model.embed(xm)
                    for block in mine:
                        h = block(h)
                outs.append(h)
                pending.append(dist.isend(h.detach().contiguous(), 1))
            for h in outs:
                g = torch.empty(shape, device=dev)
                with timer("comm"):
                    dist.recv(g, 1)
                with timer("compute"):
                    h.backward(g)
        else:
            for ym in y.chunk(micro_batches):
                h = torch.empty(shape, device=dev)
                with timer("comm"):
                    dist.recv(h, 0)
                with timer("compute"):
                    h.requires_grad_()
                    out = h
                    for block in mine:
                        out = block(out)
                    (lm_loss(model.logits(out), ym) / micro_batches).backward()
                pending.append(dist.isend(h.grad.contiguous(), 0))
        with timer("comm"):
            for work in pending:
                work.wait()
        with timer("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    step.model, step.params = model, params        # this stage's share, for checks
    return step
