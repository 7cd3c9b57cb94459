"""Rank cells: ``%%ranks 4`` runs a notebook cell's code on 4 ranks.

:func:`lecture_lib.run` needs a function; while exploring, a cell is handier.
nbdistributed's ``%%distributed`` cells and accelerate's ``notebook_launcher``
do this with their own workers; here the cell goes through the same
``lecture_lib.run`` as everything else, so it has the same failure handling
(a rank that raises gives :class:`~lecture_lib.RankError`, a hang gives
:class:`~lecture_lib.RankTimeout` with every stuck rank's stack, and no
process is left behind)::

    %load_ext lecture_lib.runtime.magic   # done for you by `import lecture_lib` in IPython

    %%ranks 4 --in x --out y
    t = torch.tensor([x * (rank + 1.0)], device=device)
    dist.all_reduce(t)
    y = t.item()
    rank, y                            # the cell's value: one (rank, y) per rank

Inside the cell ``rank``, ``world_size`` and ``device`` (the rank's device)
are defined, and ``torch`` and ``dist`` (``torch.distributed``) are imported.
The cell's last expression, evaluated on every rank, is the magic's value (a
list by rank; nothing when the cell ends in a statement). ``--in x,y`` sends
notebook variables to the ranks (by value, with cloudpickle); ``--out z``
brings each rank's ``z`` back as a list by rank, bound to ``z`` in the
notebook. ``--timeout S`` and ``--backend`` are passed to ``run``.
"""
from __future__ import annotations

import ast
import linecache

import torch
import torch.distributed as dist
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import launch

FILENAME = "<%%ranks cell>"


def _names(option: str | None) -> list[str]:
    names = [n.strip() for n in (option or "").split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UsageError(f"not variable names: {bad} (write --in x,y)")
    return names


def split_cell(code: str) -> tuple[ast.Module, ast.Expression | None]:
    """The cell's statements and, when it ends in an expression, that expression apart.
    A SyntaxError shows here, in the notebook, before any process starts."""
    tree = ast.parse(code, FILENAME)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return tree, last
    return tree, None


def run_cell_on_rank(code: str, inputs: dict, outputs: list[str]):
    """What every rank runs: the cell in a fresh namespace; ``(last value, {out: value})``."""
    body, last = split_cell(code)
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)  # tracebacks
    namespace = {"__name__": "__ranks__", "torch": torch, "dist": dist, **inputs,
                 "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                 "device": launch.device()}
    exec(compile(body, FILENAME, "exec"), namespace)                 # noqa: S102  the cell
    value = eval(compile(last, FILENAME, "eval"), namespace) if last else None  # noqa: S307
    missing = [n for n in outputs if n not in namespace]
    if missing:
        raise NameError(f"--out names {missing}, which the cell did not define on rank "
                        f"{dist.get_rank()}")
    return value, {n: namespace[n] for n in outputs}


def run_ranks(code: str, world_size: int, inputs: dict | None = None,
              outputs: list[str] | tuple = (), timeout: float = launch.DEFAULT_TIMEOUT,
              backend: str = "auto"):
    """The magic without IPython: run ``code`` on ``world_size`` ranks; return
    ``(values by rank, {out name: values by rank})``."""
    split_cell(code)                                                  # syntax first
    results = launch.run(run_cell_on_rank, world_size, code, dict(inputs or {}), list(outputs),
                         timeout=timeout, backend=backend)
    values = [value for value, _ in results]
    return values, {n: [out[n] for _, out in results] for n in outputs}


@magic_arguments()
@argument("world_size", type=int, help="how many ranks run the cell")
@argument("--in", dest="inputs", default="", help="notebook variables sent to every rank: x,y")
@argument("--out", dest="outputs", default="",
          help="variables brought back, as a list by rank bound in the notebook: z")
@argument("--timeout", type=float, default=launch.DEFAULT_TIMEOUT,
          help="seconds before the call ends with RankTimeout")
@argument("--backend", default="auto", help="auto, gloo or nccl")
def ranks(line: str, cell: str, local_ns: dict | None = None):
    """%%ranks N [--in x,y] [--out z] [--timeout S]: run this cell on N ranks."""
    args = parse_argstring(ranks, line)
    user_ns = local_ns if local_ns is not None else get_ipython().user_ns
    names_in, names_out = _names(args.inputs), _names(args.outputs)
    missing = [n for n in names_in if n not in user_ns]
    if missing:
        raise UsageError(f"--in names {missing}, which the notebook has not defined")
    values, outs = run_ranks(cell, args.world_size, {n: user_ns[n] for n in names_in},
                             names_out, timeout=args.timeout, backend=args.backend)
    user_ns.update(outs)
    _, last = split_cell(cell)
    return values if last is not None else None


def load_ipython_extension(shell) -> None:
    """``%load_ext lecture_lib.runtime.magic``."""
    shell.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")


def register_if_in_ipython() -> bool:
    """Register ``%%ranks`` in the running IPython shell, if there is one."""
    shell = get_ipython()
    if shell is None:
        return False
    load_ipython_extension(shell)
    return True


__all__ = ["ranks", "run_ranks", "load_ipython_extension", "register_if_in_ipython"]
