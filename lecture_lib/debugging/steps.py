"""A data-parallel training step, run under the debugging tools: what do they find?

``step(model, optimizer, x, y) -> float`` is one data-parallel step as a rank runs it
(its shard of the global batch in, the loss out, the optimizer stepped).
:func:`inspect_train_step` runs it on ``world_size`` ranks on the small GPT with SGD, and
looks at it the three ways of notebook 09's section 4:

1. **replicas**: :func:`~.consistency.check_gradient_consistency` after every step names
   the first parameter whose gradient or value differs between ranks (Li et al. 2020,
   "PyTorch Distributed": every replica must hold the same state);
2. **the update**: each parameter's change against the change one process makes on the
   whole batch (with SGD an update is the learning rate times the gradient, so the ratio
   is how many times too large the synchronised gradient is); a bug every rank makes
   alike shows here, not in the consistency check;
3. **the loss**: what each rank returns, against the other ranks and against the loss of
   the global batch in one process.

:attr:`StepReport.findings` says in words what differs; an empty list: nothing found.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from ..models import GPT, GPTConfig, MarkovText, make_optimizer, shard, train_reference
from ..runtime import launch
from .consistency import Inconsistency, check_gradient_consistency

DEFAULT_CFG = GPTConfig(d_model=32, n_layers=2, seq_len=16, n_heads=2)


@dataclass
class StepReport:
    """What the tools saw; every field compares the ranks' run with one process."""
    inconsistency: tuple[int, Inconsistency] | None   # (step, the first finding) or None
    update_ratio: dict[str, float]    # parameter -> |rank 0's update| / |one process's|
    losses: list[list[float]]         # per rank, what the step returned
    reference_losses: list[float]     # one process, the global batch
    tolerance: float = 1e-4
    findings: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.findings = self._findings()

    def _findings(self) -> list[str]:
        found = []
        if self.inconsistency is not None:
            step, what = self.inconsistency
            found.append(f"after step {step}: {what}")
        off = {n: r for n, r in self.update_ratio.items() if abs(r - 1) > self.tolerance}
        if off:
            ratios = sorted(off.values())
            found.append(f"{len(off)} of {len(self.update_ratio)} parameters updated unlike one "
                         f"process: |update| / |one process's| from {ratios[0]:.3f} to "
                         f"{ratios[-1]:.3f} (median {ratios[len(ratios) // 2]:.3f})")
        spread = max(max(r) - min(r) for r in zip(*self.losses))
        if spread > self.tolerance:
            found.append(f"the ranks return different losses (up to {spread:.3g} apart)")
        error = max(abs(a - b) for a, b in zip(self.losses[0], self.reference_losses))
        if error > self.tolerance:
            found.append(f"rank 0 returns a loss {error:.3g} away from the global batch's "
                         f"loss in one process")
        return found


def _run_step(step, cfg, steps: int, batch_size: int, lr: float) -> dict:
    rank, size = dist.get_rank(), dist.get_world_size()
    data = MarkovText(cfg.vocab_size, cfg.seq_len)
    model = GPT(cfg)
    optimizer = make_optimizer(model.parameters(), "sgd", lr)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses, first = [], None
    for s in range(steps):
        x, y = shard(data.batch(s, batch_size), rank, size)
        losses.append(float(step(model, optimizer, x, y)))
        found = check_gradient_consistency(model)
        if first is None and found is not None:
            first = (s, found)
    return {"losses": losses, "inconsistency": first, "start": start,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def inspect_train_step(step, world_size: int = 2, *, steps: int = 1, batch_size: int = 8,
                       lr: float = 0.1, cfg: GPTConfig | None = None,
                       timeout: float = 120) -> StepReport:
    """Run ``step(model, optimizer, x, y) -> loss`` on ``world_size`` ranks for ``steps``
    steps (SGD at ``lr``; the global batch of ``batch_size`` sequences split equally over the
    ranks; the call ends after ``timeout`` seconds); what the tools find.

    The :class:`StepReport` compares with one process training on the whole batch: the first
    parameter whose replicas differ (``inconsistency``), each parameter's update as a ratio
    to one process's (1.0 = equal), and the losses the ranks returned; ``findings`` lists, in
    words, whatever differs by more than ``tolerance`` (empty: nothing found)."""
    if not callable(step):
        raise TypeError(f"step must be a function (model, optimizer, x, y) -> float, "
                        f"not {type(step).__name__}")
    for name, v in (("world_size", world_size), ("steps", steps), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, not {v!r}")
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} does not split into {world_size} equal shards")
    cfg = cfg or DEFAULT_CFG
    ranks = launch.run(_run_step, world_size, step, cfg, steps, batch_size, lr, timeout=timeout)
    data = MarkovText(cfg.vocab_size, cfg.seq_len)
    ref = train_reference(GPT(cfg), lambda s: data.batch(s, batch_size), steps, lr=lr,
                          optimizer="sgd")
    mine = ranks[0]
    ratio = {}
    for name, start in mine["start"].items():
        want = (ref.params[name] - start).norm().item()
        got = (mine["params"][name] - start).norm().item()
        ratio[name] = got / want if want > 0 else (1.0 if got == 0 else float("inf"))
    first = next((r["inconsistency"] for r in ranks if r["inconsistency"] is not None), None)
    return StepReport(first, ratio, [r["losses"] for r in ranks], list(ref.losses))


__all__ = ["StepReport", "inspect_train_step"]
