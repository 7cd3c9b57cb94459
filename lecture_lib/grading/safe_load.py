"""What a submission's process hands back crosses the trust boundary as data only.

The sandboxed child converts a result with :func:`to_data` (tensors, numbers,
strings, bytes, None, lists, tuples and dicts of them, and a few of the pack's
own plain dataclasses, sent as their fields) and serialises it with
:func:`encode` (``torch.save``). The grader decodes with :func:`decode`:
``torch.load(..., weights_only=True)``, PyTorch's restricted unpickler, which
refuses every global outside a short allowlist of tensor-rebuilding functions
(the same defence ``torch.load`` offers against a malicious checkpoint), then
rebuilds the allowlisted dataclasses from their fields by calling their
constructors. A submission can make its process send any bytes at all; the
worst those bytes can do is be refused, which fails the test with
:class:`ForbiddenValue`, a message saying what was refused.
"""
from __future__ import annotations

import dataclasses
import io
from collections import OrderedDict

import torch

from ..models import TrainResult
from ..pipeline.actions import Action
from ..pipeline.recorder import StepRecord
from ..runtime import RankError, RankTimeout

#: The pack's plain dataclasses that may cross, by name (their constructors only store fields).
ALLOWED_CLASSES: dict[str, type] = {
    f"{c.__module__}.{c.__qualname__}": c for c in (TrainResult, StepRecord, Action)}
_TAG = "__lecture_lib_dataclass__"
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.Size)
_MAX_DEPTH = 64
ALLOWED = ("tensors, numbers, strings, bytes, None, lists, tuples and dicts of them, and "
           + ", ".join(c.__qualname__ for c in ALLOWED_CLASSES.values()))


class ForbiddenValue(TypeError):
    """A value that may not cross from a submission's process to the grader."""


def to_data(value, where: str = "the result", depth: int = 0):
    """``value`` as plain data (in the submission's process); ForbiddenValue if it is not."""
    if depth > _MAX_DEPTH:
        raise ForbiddenValue(f"{where} is nested more than {_MAX_DEPTH} levels deep")
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind in (torch.Tensor, torch.nn.Parameter):
        if value.layout != torch.strided:
            raise ForbiddenValue(f"{where} is a {value.layout} tensor: send a dense one")
        return value.detach().cpu().clone()          # its own storage, not a view's
    if kind in (list, tuple):
        return kind(to_data(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    if kind in (dict, OrderedDict):
        out = {}
        for k, v in value.items():
            if type(k) not in (str, int, float, bool, tuple, type(None)):
                raise ForbiddenValue(f"{where} has a key of type {type(k).__name__}")
            out[k] = to_data(v, f"{where}[{k!r}]", depth + 1)
        return out
    name = f"{kind.__module__}.{kind.__qualname__}"
    if ALLOWED_CLASSES.get(name) is kind:
        fields = {f.name: to_data(getattr(value, f.name), f"{where}.{f.name}", depth + 1)
                  for f in dataclasses.fields(value)}
        return {_TAG: name, "fields": fields}
    raise ForbiddenValue(f"{where} is a {name}, which cannot cross to the grader: only "
                         f"{ALLOWED} can")


def encode(value) -> bytes:
    """Serialise plain data (the output of :func:`to_data`)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def decode(data: bytes):
    """Plain data from bytes a submission's process sent; ForbiddenValue for anything else."""
    try:
        value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:                 # any refusal or corrupt input: one clear error
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ForbiddenValue(f"the submission's process sent data the grader refuses to "
                             f"decode (only {ALLOWED} may cross): {first}") from None
    return _rebuild(value, "the result", 0)


def _rebuild(value, where: str, depth: int):
    if depth > _MAX_DEPTH:
        raise ForbiddenValue(f"{where} is nested more than {_MAX_DEPTH} levels deep")
    kind = type(value)
    if kind in _ATOMS or kind is torch.Tensor:
        return value
    if kind is torch.nn.Parameter:
        return value.detach()
    if kind in (list, tuple):
        return kind(_rebuild(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    if kind in (dict, OrderedDict):
        if _TAG in value:
            return _dataclass(value, where, depth)
        return {k: _rebuild(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}
    raise ForbiddenValue(f"{where} decoded to a {kind.__name__}, which the grader refuses")


def _dataclass(value: dict, where: str, depth: int):
    cls = ALLOWED_CLASSES.get(value.get(_TAG))
    fields = value.get("fields")
    if cls is None or type(fields) is not dict:
        raise ForbiddenValue(f"{where} names a class the grader does not rebuild: "
                             f"{str(value.get(_TAG))[:100]}")
    try:
        return cls(**{k: _rebuild(v, f"{where}.{k}", depth + 1) for k, v in fields.items()})
    except TypeError as exc:
        raise ForbiddenValue(f"{where}: cannot rebuild {cls.__qualname__}: {exc}") from None


def error_data(exc: BaseException, traceback_text: str) -> dict:
    """An exception raised in the submission's process, as plain data for the grader."""
    names = [c.__name__ for c in type(exc).__mro__]
    data = {"types": names[:12], "message": str(exc)[-20000:], "traceback": traceback_text[-8000:]}
    if isinstance(exc, RankError):
        data["rank"] = int(exc.rank)
        data["rank_traceback"] = str(exc.traceback)[-8000:]
    if isinstance(exc, RankTimeout):
        data["stacks"] = {int(r): str(s)[-4000:] for r, s in exc.stacks.items()}
    return data
