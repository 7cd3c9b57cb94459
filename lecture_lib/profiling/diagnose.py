"""The lecture's rules of thumb, applied to measured shares of a step.

Two rules ("common problems and debugging"; the Ultra-Scale Playbook's
profiling chapter):

* **exposed communication over 30% of the step** (the devices wait for it; what
  runs under a kernel costs nothing): the job is communication-bound.
  What to do depends on *which* communication it is. Gradient all-reduces
  (data parallelism, Li et al. 2020): look at all-reduce efficiency, bucket
  gradients into fewer, larger messages and overlap them with the backward
  pass. Point-to-point sends and receives (a pipeline, Huang et al. 2019):
  the time is mostly stages waiting for their neighbours, the bubble; more
  micro-batches, an interleaved or zero-bubble schedule, balanced stages.
  Gathers and scatters of shards (ZeRO/FSDP, tensor parallelism), all-to-all
  (experts): prefetch or overlap them, keep the group on the fast link.
* **device busy under 70% of the step**: the device is underused. When the
  exposed communication is most of the time it idles, that is the cause: fix it
  first. Otherwise raise the batch (more work per launch and per message), or
  fix the pipeline when the run is one (bubbles, a slow stage), or the host
  overhead between operators.

``comm_kinds`` (what :attr:`~.trace.RankProfile.comm_kinds` read from the
trace) chooses the advice; without it the advice is the general one.
``overlapped=True`` says the run already buckets its all-reduces and overlaps
them with the backward pass: the advice for all-reduces is then what is left,
more work per all-reduce or a faster link.
"""
from __future__ import annotations

from dataclasses import dataclass

from .trace import exposed_share

COMM_SHARE_LIMIT = 0.30
BUSY_SHARE_LIMIT = 0.70

_ADVICE = {   # what to look at when this kind of communication dominates
    "all_reduce": "look at all-reduce efficiency (bus bandwidth against the link's), bucket "
                  "gradients into fewer, larger messages and overlap them with the backward pass",
    "all_reduce, overlapped": "the all-reduces already run in buckets during the backward pass: "
                              "give each more work to hide behind (more sequences per GPU, or "
                              "gradient accumulation), or keep the group on a faster link",
    "p2p": "a pipeline's sends and receives are mostly stages waiting for their neighbours "
           "(the bubble): use more micro-batches, an interleaved or zero-bubble schedule, and "
           "stages of equal cost",
    "shards": "gathers and scatters of sharded weights or activations: prefetch the next one "
              "while computing (overlap) and keep the group on the fastest link",
    "all_to_all": "the experts' all-to-all: balance the experts' load (router, capacity "
                  "factor) and keep the expert group on the fastest link",
}
_FAMILY = {"all_reduce": "all_reduce", "send": "p2p", "recv": "p2p", "all_gather": "shards",
           "reduce_scatter": "shards", "all_to_all": "all_to_all"}


@dataclass
class Diagnosis:
    comm_share: float
    busy_share: float
    comm_bound: bool
    underused: bool
    findings: list[str]

    def __str__(self):
        return "\n".join(self.findings)


def _comm_advice(comm_kinds, overlapped) -> str:
    if comm_kinds is None:                      # not known: the general advice
        return ("if it is gradient all-reduce, " + _ADVICE["all_reduce"] + "; if it is a "
                "pipeline's sends and receives, " + _ADVICE["p2p"].split(": ", 1)[1])
    families = sorted({_FAMILY[k] for k in comm_kinds if k in _FAMILY})
    if not families:
        return "no collective of a training scheme is in the trace: look at what communicates"
    if overlapped:
        families = [f + ", overlapped" if f == "all_reduce" else f for f in families]
    return "; ".join(_ADVICE[f] for f in families)


def _busy_advice(comm_kinds) -> str:
    batch = "raise the batch size so each step has more work per launch and per message"
    host = "host overhead between operators"
    if comm_kinds is None:                      # not known: the general advice
        return f"{batch}, or fix the pipeline (bubbles, a slow stage, {host})"
    if {"send", "recv"} & set(comm_kinds):
        return ("fix the pipeline: more micro-batches per step shrink the bubble, then look "
                f"for a slow stage and {host}")
    return f"{batch}, and look for {host}"


def diagnose(comm_share: float, busy_share: float, *, comm_kinds=None,
             overlapped: bool = False, comm_limit: float = COMM_SHARE_LIMIT,
             busy_limit: float = BUSY_SHARE_LIMIT) -> Diagnosis:
    """Apply the lecture's rules of thumb to measured shares and say what they show.
    ``comm_share``: the exposed share of the step (communication the devices wait for,
    :func:`~.trace.exposed_share`), not the share in flight.

    ``comm_kinds``: the collectives the run did (``{"all_reduce"}``, ``{"send",
    "recv"}``, ..., as :func:`~.events.comm_kinds` reads them); it decides the
    advice, so a pipeline is never told to bucket its gradients. ``overlapped``: the
    run already buckets its all-reduces and overlaps them with backward, so it is
    not told to.
    """
    if not isinstance(overlapped, bool):
        raise ValueError(f"overlapped must be True or False, not {overlapped!r}")
    for name, v in (("comm_share", comm_share), ("busy_share", busy_share),
                    ("comm_limit", comm_limit), ("busy_limit", busy_limit)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1], not {v!r}")
    comm_bound, underused = comm_share > comm_limit, busy_share < busy_limit
    findings = []
    if comm_bound:
        findings.append(f"the devices wait for communication {comm_share:.0%} of the step "
                        f"(> {comm_limit:.0%}): "
                        + _comm_advice(comm_kinds, overlapped))
    if underused:
        idle_is_comm = comm_bound and comm_share >= (1 - busy_share) / 2
        findings.append(f"the device is busy only {busy_share:.0%} of the step "
                        f"(< {busy_limit:.0%}): "
                        + ("most of the idle time is the exposed communication above: fix it "
                           "first" if idle_is_comm else _busy_advice(comm_kinds)))
    if not findings:
        findings.append(f"exposed communication {comm_share:.0%} (<= {comm_limit:.0%}) and "
                        f"device busy {busy_share:.0%} (>= {busy_limit:.0%}): no rule of thumb "
                        "fires")
    return Diagnosis(comm_share, busy_share, comm_bound, underused, findings)


def diagnose_run(profiles, **options) -> Diagnosis:
    """:func:`diagnose` of a run: its ranks' mean exposed and busy shares
    (:func:`~.trace.exposed_share`), the advice by every collective any rank ran."""
    if not profiles:
        raise ValueError("no profiles given")
    kinds = set().union(*(p.comm_kinds for p in profiles))
    return diagnose(sum(exposed_share(p) for p in profiles) / len(profiles),
                    sum(p.busy_share for p in profiles) / len(profiles), comm_kinds=kinds,
                    **options)
