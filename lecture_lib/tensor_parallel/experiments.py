"""What notebook 04 runs: training equal to one process, and the measurements.

* :func:`train_tensor_parallel` trains the GPT split over ``tp`` ranks and
  gathers the parameters, to compare with :func:`train_reference`.
* :func:`measure_block`: one block's collectives (counted through
  :func:`lecture_lib.comm.record_comm`) and the activations autograd keeps,
  for the sequence-parallel comparison of Korthikanti et al. 2022.
* :func:`measure_step`: step time and the time inside collectives;
  :func:`measure_step_scaling` runs it for several ``tp``, with progress, in
  real time or (``preset=``) in the virtual time of :mod:`lecture_lib.emulate`
  (:func:`measure_step_emulated`); :func:`measure_links` does that for several
  links (NVLink inside a node against InfiniBand across nodes).
* :func:`compare_with_dtensor`: our :class:`ParallelMLP` against torch's
  DTensor tensor parallelism, outputs and time.

Time at real size (one layer of GPT-3 175B, Llama 3, ... in the dry run) is
:mod:`.emulated`'s :func:`~lecture_lib.tensor_parallel.emulated.time_at_scale`.
The layers themselves never time anything: the recorders are turned on here.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from .. import comm, emulate, models
from ..comm import record_comm
from ..metrics import saved_tensor_bytes, wall_time
from ..progress import progress
from ..runtime import device as rank_device
from ..runtime import run
from .layers import ParallelMLP
from .model import ParallelBlock, TensorParallelGPT, check_tensor_parallel, gather_full
from .sequence_parallel import (
    SequenceParallelBlock,
    SequenceParallelGPT,
    sync_sequence_parallel_grads,
)

OPTIMIZERS = ("adamw", "sgd")           # what models.make_optimizer builds


def split_gpt(gpt: models.GPT, group=None, sequence_parallel: bool = False):
    """``gpt`` split over ``group``: a :class:`TensorParallelGPT` or, with
    ``sequence_parallel``, a :class:`SequenceParallelGPT`."""
    return (SequenceParallelGPT if sequence_parallel else TensorParallelGPT)(gpt, group)


def split_block(block: models.Block, group=None, sequence_parallel: bool = False):
    """``block`` split over ``group`` (:class:`ParallelBlock` or :class:`SequenceParallelBlock`)."""
    return (SequenceParallelBlock if sequence_parallel else ParallelBlock)(block, group)


def _data(cfg: models.GPTConfig, data_seed: int):
    return models.MarkovText(cfg.vocab_size, cfg.seq_len, data_seed)


def train_reference(cfg: models.GPTConfig, steps: int, batch_size: int = 8, seed: int = 0,
                    data_seed: int = 0, lr: float = 1e-2, optimizer: str = "adamw"):
    """The one-process run that :func:`train_tensor_parallel` must equal."""
    text = _data(cfg, data_seed)
    return models.train_reference(models.GPT(cfg, seed), lambda s: text.batch(s, batch_size),
                                  steps, lr, optimizer)


def train_on_rank(cfg: models.GPTConfig, steps: int, batch_size: int = 8, seed: int = 0,
                  data_seed: int = 0, lr: float = 1e-2, optimizer: str = "adamw",
                  sequence_parallel: bool = False, group=None) -> models.TrainResult:
    """Inside a rank: build the full GPT from the seed, split it, train; full params back."""
    dev = rank_device()
    model = split_gpt(models.GPT(cfg, seed), group, sequence_parallel)
    opt = models.make_optimizer(model.parameters(), optimizer, lr)
    text, losses = _data(cfg, data_seed), []
    for step in range(steps):
        x, y = (t.to(dev) for t in text.batch(step, batch_size))
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        sync_sequence_parallel_grads(model, group)
        opt.step()
        losses.append(loss.item())
    return models.TrainResult(losses, gather_full(model, group))


def train_tensor_parallel(cfg: models.GPTConfig, tp: int, steps: int, batch_size: int = 8,
                          seed: int = 0, data_seed: int = 0, lr: float = 1e-2,
                          optimizer: str = "adamw", sequence_parallel: bool = False,
                          timeout: float = 120) -> models.TrainResult:
    """Train the GPT split over ``tp`` ranks; rank 0's losses and the gathered parameters."""
    check_tensor_parallel(cfg, tp, sequence_parallel)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {optimizer!r}")
    results = run(train_on_rank, tp, cfg, steps, batch_size, seed, data_seed, lr, optimizer,
                  sequence_parallel, timeout=timeout)
    return results[0]


def measure_block(cfg: models.GPTConfig, batch_size: int, sequence_parallel: bool = False,
                  seed: int = 0, group=None) -> dict:
    """Inside a rank: one block's forward and backward, its collectives counted and its
    saved activations measured (bytes autograd keeps, parameters excluded)."""
    dev = rank_device()
    block = split_block(models.GPT(cfg, seed).blocks[0], group, sequence_parallel)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch_size, cfg.seq_len, cfg.d_model, generator=g).to(dev)
    if sequence_parallel:
        rank, tp = comm.group_info(group)
        x = x.chunk(tp, 1)[rank].contiguous()
    x.requires_grad_(True)
    with record_comm() as counter:
        with saved_tensor_bytes() as saved:
            y = block(x)
        y.pow(2).sum().backward()
    return {"comm": counter.summary(), "sent_bytes": {ph: counter.sent_bytes(ph)
                                                      for ph in ("forward", "backward")},
            "activation_bytes": saved.activation_bytes(block)}


def measure_step(cfg: models.GPTConfig, batch_size: int, steps: int = 5, warmup: int = 2,
                 seed: int = 0, group=None) -> dict:
    """Inside a rank: median training-step time, the time in collectives, tokens/s.

    The collectives are timed (a recorder is on), so on a GPU each one
    synchronises the device at both ends: the step measured here is the step
    without overlap between communication and computation.
    """
    dev = rank_device()
    model = TensorParallelGPT(models.GPT(cfg, seed), group)
    opt = models.make_optimizer(model.parameters(), "adamw")
    text = _data(cfg, 0)
    times, in_comm, sent, losses = [], [], [], []
    for step in range(warmup + steps):
        x, y = (t.to(dev) for t in text.batch(step, batch_size))
        with record_comm() as counter, wall_time(dev) as t:
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
        losses.append(loss.item())
        if step >= warmup:
            times.append(t.seconds)
            in_comm.append(counter.seconds())
            sent.append(counter.sent_bytes())
    mid = sorted(range(steps), key=times.__getitem__)[steps // 2]
    return {"step_s": times[mid], "comm_s": in_comm[mid], "comm_share": in_comm[mid] / times[mid],
            "tokens_per_s": batch_size * cfg.seq_len / times[mid], "sent_bytes": sent[mid],
            "losses": losses, "time": t.time_kind}


def measure_step_emulated(cfg: models.GPTConfig, batch_size: int, preset="h100-node",
                          steps: int = 1, warmup: int = 0, seed: int = 0, group=None) -> dict:
    """Inside a rank: :func:`measure_step` in the virtual time of ``preset`` (a preset name
    or an :class:`~lecture_lib.emulate.Cluster`): every operation charged on the device's
    roofline, every collective by its alpha-beta cost on the link the group's ranks share
    (NVLink inside a node, InfiniBand across). Virtual time needs no warm-up."""
    with emulate.emulated(preset):
        return measure_step(cfg, batch_size, steps, warmup, seed, group)


def _check_scaling(cfg, batch_size, tps, steps, warmup) -> list:
    """Every tp, the batch and the step counts, checked before any rank starts."""
    tps = list(tps)
    if not tps:
        raise ValueError("tps must name at least one tensor-parallel size")
    for tp in tps:
        check_tensor_parallel(cfg, tp)
    for name, value, least in (("batch_size", batch_size, 1), ("steps", steps, 1),
                               ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be a whole number >= {least}, not {value!r}")
    return tps


def measure_step_scaling(cfg: models.GPTConfig, batch_size: int, tps, steps: int = 5,
                         warmup: int = 2, seed: int = 0, backend: str = "auto",
                         timeout: float = 180, preset=None) -> dict:
    """``{tp: rank 0's measure_step(...)}`` for each ``tp`` in ``tps`` (all checked first),
    one call of ``tp`` ranks each, with :func:`~lecture_lib.progress.progress`.

    ``preset`` (a preset name or an :class:`~lecture_lib.emulate.Cluster`): the steps
    run in its virtual time (:func:`measure_step_emulated`); ``None``: real time.
    """
    tps = _check_scaling(cfg, batch_size, tps, steps, warmup)
    if preset is None:
        fn, extra, what = measure_step, (), "real time"
    else:
        cluster = emulate.preset(preset)              # a bad preset fails here
        fn, extra, what = measure_step_emulated, (cluster,), emulate.label(cluster)
    return {tp: run(fn, tp, cfg, batch_size, *extra, steps, warmup, seed, backend=backend,
                    timeout=timeout)[0]
            for tp in progress(tps, f"tensor-parallel step time ({what}): one tp each")}


def measure_links(cfg: models.GPTConfig, batch_size: int, tps, presets: dict, steps: int = 1,
                  timeout: float = 180) -> dict:
    """``{name: {tp: row}}``: :func:`measure_step_scaling` in the virtual time of each
    ``presets[name]`` (all checked first). One rank sends nothing, so ``tp = 1`` runs once,
    on the first preset, and is shared (the presets must share their device)."""
    if not isinstance(presets, dict) or not presets:
        raise ValueError("presets must be a non-empty {name: preset} dict")
    clusters = {name: emulate.preset(p) for name, p in presets.items()}
    if len({(c.device, c.fp32) for c in clusters.values()}) > 1:
        raise ValueError("measure_links compares links: the presets must share one device "
                         "and fp32 mode")
    tps = _check_scaling(cfg, batch_size, tps, steps, 0)
    out, first = {}, True
    for name, cluster in clusters.items():
        mine = [tp for tp in tps if tp > 1 or first]
        out[name] = measure_step_scaling(cfg, batch_size, mine, steps, 0, timeout=timeout,
                                         preset=cluster) if mine else {}
        first = False
    one = next(iter(out.values())).get(1)
    return {name: {tp: one if tp == 1 else rows[tp] for tp in tps} for name, rows in out.items()}


def _fwd_bwd(module, x):
    xi = x.clone().requires_grad_(True)
    y = module(xi)
    y.pow(2).sum().backward()
    return y.detach(), xi.grad


def compare_with_dtensor(d_model: int, d_ff: int, tokens: int, steps: int = 5,
                         seed: int = 0) -> dict:
    """Inside a rank (world group): our ParallelMLP and torch's DTensor tensor parallelism
    (``parallelize_module`` with ColwiseParallel / RowwiseParallel) on one MLP.

    Returns both outputs and input gradients (full, on every rank) and the
    median forward+backward time of each, measured alternately in one run
    (no recorder on: the collectives run as in training).
    """
    # DTensor's import takes about a second; only this comparison needs it.
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.tensor.parallel import (  # noqa: PLC0415
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    dev = rank_device()
    cfg = models.GPTConfig(d_model=d_model, d_ff=d_ff, n_heads=1, n_layers=1)
    full = models.GPT(cfg, seed).blocks[0].mlp
    ours = ParallelMLP(full)
    theirs = copy.deepcopy(full).to(dev)
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    parallelize_module(theirs, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    out, times = {}, {"ours": [], "dtensor": []}
    for i in range(steps + 1):
        for name, module in (("ours", ours), ("dtensor", theirs)):
            module.zero_grad(set_to_none=True)
            with wall_time(dev) as t:
                y, gx = _fwd_bwd(module, x)
            if i:                                 # the first step warms up
                times[name].append(t.seconds)
            out[name] = (y.cpu(), gx.cpu())
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"ours": out["ours"], "dtensor": out["dtensor"], "ours_s": med["ours"],
            "dtensor_s": med["dtensor"], "ratio": med["dtensor"] / med["ours"]}
