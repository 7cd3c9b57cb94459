"""Point-to-point messages in virtual time: a message carries its sender's clock.

``send``/``isend`` first send a one-number float64 message with the time the
transfer starts on the sender (``max(compute, comm)``), then the data, with
the same peer, group and tag (messages between two ranks on one tag arrive in
order). The sender's communication stream is busy for ``alpha + n / beta``
on the link between the two ranks' nodes. The receiver computes the arrival
``start + alpha + n / beta`` from the size it receives, and its compute
stream waits until then, at ``recv`` or at the ``wait()`` of an ``irecv``
(an eager protocol: the data may arrive before the receive is posted).
A receive does not occupy the receiver's stream (links are full duplex).

``batch_isend_irecv`` runs each operation as an emulated ``isend``/``irecv``
(a gloo process group does not coalesce them either). ``irecv`` from any
source is refused: the emulation must know the sender to charge the link.

A send starts when its data is ready and the comm stream is done with what
this rank knows: asynchronous collectives whose start the ranks have not
agreed yet (:mod:`.comm`) do not delay it (agreeing there would be a
collective that the receiver, waiting in its receive, never joins). With one
agreement per collective only the last was ever pending, so a send issued
while two or more are pending now starts earlier than it did. In the dry
run the data is not sent (fake tensors have none) but the stamps are, as
real tensors: the receiver's clock is the same as in a real run.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import ORIGINAL, EmulatedWork, Once, State, arguments, nbytes_of


def _peer(a: dict, key: str) -> int | None:
    """The peer's global rank from ``dst``/``src`` or ``group_dst``/``group_src``."""
    if a.get(key) is not None:
        return a[key]
    if a.get(f"group_{key}") is not None:
        return dist.get_global_rank(a["group"] or dist.group.WORLD, a[f"group_{key}"])
    return None


def _stamp_kwargs(a: dict, key: str) -> dict:
    return {key: a[key], "group": a["group"], "tag": a["tag"],
            f"group_{key}": a[f"group_{key}"]}


def _data(state: State, name: str, a: dict, key: str):
    """The real message (none in the dry run: fake tensors have no data)."""
    if state.dry_run:
        return None
    with state.real():
        return ORIGINAL[name](a["tensor"], **_stamp_kwargs(a, key))


def _send(state: State, a: dict, asynchronous: bool):
    clock = state.clock
    peer, n = _peer(a, "dst"), nbytes_of(a["tensor"])
    start = max(clock.compute, clock.comm)
    end = start + state.cluster.p2p_seconds(n, [state.rank, peer])
    with state.real():
        stamp = torch.tensor([start], dtype=torch.float64)
        stamp_work = ORIGINAL["isend"](stamp, **_stamp_kwargs(a, "dst"))
    clock.comm_span(f"send to {peer}", start, end, n, kind="send")
    if not asynchronous:
        _data(state, "send", a, "dst")
        with state.real():
            stamp_work.wait()
        clock.wait_until(end)
        return None
    work = _data(state, "isend", a, "dst")
    return EmulatedWork([stamp_work, work], state, lambda: end)


def _arrival(state: State, a: dict, peer: int, stamp: torch.Tensor, issue: float) -> float:
    n = nbytes_of(a["tensor"])
    with state.real():
        start = float(stamp.item())
    arrival = start + state.cluster.p2p_seconds(n, [state.rank, peer])
    done = max(issue, arrival)
    state.clock.comm_span(f"recv from {peer}", max(issue, start), done, n, occupy=False,
                          kind="recv")
    return done


def _recv(state: State, a: dict, asynchronous: bool):
    clock = state.clock
    issue, peer = clock.compute, _peer(a, "src")
    if asynchronous and peer is None:
        raise ValueError("emulated irecv needs its source (src or group_src): the emulation "
                         "charges the link between the two ranks")
    with state.real():
        stamp = torch.zeros(1, dtype=torch.float64)
        if asynchronous:
            stamp_work = ORIGINAL["irecv"](stamp, **_stamp_kwargs(a, "src"))
        else:
            sender = ORIGINAL["recv"](stamp, **_stamp_kwargs(a, "src"))
    if asynchronous:
        work = _data(state, "irecv", a, "src")
        return EmulatedWork([stamp_work, work], state,
                            Once(state, lambda: _arrival(state, a, peer, stamp, issue)))
    peer = sender if peer is None else peer
    a = {**a, "src": peer, "group_src": None}
    source = _data(state, "recv", a, "src")
    clock.wait_until(_arrival(state, a, peer, stamp, issue))
    return peer if source is None else source


def send(state, name, args, kwargs):
    return _send(state, arguments(name, args, kwargs), asynchronous=False)


def isend(state, name, args, kwargs):
    return _send(state, arguments(name, args, kwargs), asynchronous=True)


def recv(state, name, args, kwargs):
    return _recv(state, arguments(name, args, kwargs), asynchronous=False)


def irecv(state, name, args, kwargs):
    return _recv(state, arguments(name, args, kwargs), asynchronous=True)


def _is_send(op) -> bool:
    fn = getattr(op.op, "__wrapped__", op.op)
    if fn is ORIGINAL["isend"]:
        return True
    if fn is ORIGINAL["irecv"]:
        return False
    raise ValueError(f"a P2POp's op must be isend or irecv, not {op.op!r}")


def batch_isend_irecv(state, name, args, kwargs):
    ops = arguments(name, args, kwargs)["p2p_op_list"]
    works = []
    for op in ops:
        key = "dst" if _is_send(op) else "src"
        a = {"tensor": op.tensor, key: None, "group": op.group, "tag": op.tag,
             f"group_{key}": op.group_peer}
        works.append(_send(state, a, True) if key == "dst" else _recv(state, a, True))
    return works


BODIES = {"send": send, "isend": isend, "recv": recv, "irecv": irecv,
          "batch_isend_irecv": batch_isend_irecv}
