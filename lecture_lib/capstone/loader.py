"""The capstone's data loader: fixed windows of a memory-mapped token file, sharded by rank.

A token file is one long 1-D stream of token ids (``uint16`` while the vocabulary
fits, ``uint32`` beyond), memory-mapped so that a rank reads only the windows it
trains on. The loader cuts the stream into windows of ``context + 1`` tokens
starting at multiples of ``context`` (inputs are the first ``context`` tokens,
targets the same shifted by one, as nanoGPT's loader does) and visits them in a
seeded order: epoch ``e`` is ``torch.randperm(n_windows, Generator(seed + e))``.

The order is a pure function of the seed and the step, which gives the three
properties distributed training needs (Li et al. 2020, "PyTorch Distributed",
section 2: every replica trains on its own part of the same global batch):

* **one global batch**: step ``s`` takes positions ``s B .. s B + B - 1`` of
  the seeded stream, whatever the number of ranks;
* **a shard per data-parallel rank**: rank ``r`` of ``dp`` takes rows
  ``[r B/dp, (r+1) B/dp)``, the slice :func:`lecture_lib.models.shard` takes, so
  the union over the ranks of a step's batches is the one-process batch;
* **resumable**: the position is one integer (the next step), which
  :meth:`TokenLoader.state_dict` returns and a checkpoint saves.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def open_tokens(tokens, dtype=None) -> np.ndarray:
    """A 1-D array of token ids: ``tokens`` itself, or the file it names, memory-mapped.

    The dtype of a file is ``dtype``, else the ``"dtype"`` of a ``<file>.meta.json``
    or ``meta.json`` beside it, else ``uint16``.
    """
    if isinstance(tokens, (str, Path)):
        path = Path(tokens)
        if not path.is_file():
            raise ValueError(f"token file {path} does not exist")
        if dtype is None:
            dtype = _dtype_beside(path)
        if str(np.dtype(dtype)) not in DTYPES:
            raise ValueError(f"token files hold uint16 or uint32 ids, not {dtype}")
        return np.memmap(path, dtype=np.dtype(dtype), mode="r")
    array = np.asarray(tokens)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array or a token file, not "
                         f"{array.dtype} of shape {array.shape}")
    return array


def _dtype_beside(path: Path):
    for meta in (path.with_name(path.name + ".meta.json"), path.with_name("meta.json")):
        if meta.is_file():
            found = json.loads(meta.read_text()).get("dtype")
            if found:
                return found
    return np.uint16


class TokenLoader:
    """This rank's share of every global batch of ``(inputs, targets)``, in a seeded order.

    ``TokenLoader(tokens, context, global_batch, seed, dp_rank, dp_size)``;
    :meth:`next_batch` gives this rank's ``(global_batch / dp_size, context)``
    int64 inputs and targets and advances; :meth:`batch` gives any step's
    without moving; ``state_dict()`` / ``load_state_dict()`` hold the position.
    """

    def __init__(self, tokens, context: int, global_batch: int, seed: int = 0,
                 dp_rank: int = 0, dp_size: int = 1, dtype=None):
        for name, value in (("context", context), ("global_batch", global_batch),
                            ("dp_size", dp_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
        if global_batch % dp_size:
            raise ValueError(f"a global batch of {global_batch} does not split over "
                             f"dp={dp_size} ranks")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank must be in [0, {dp_size}), not {dp_rank}")
        self.tokens = open_tokens(tokens, dtype)
        self.windows = (len(self.tokens) - 1) // context
        if self.windows < global_batch:
            raise ValueError(f"{len(self.tokens)} tokens make {self.windows} windows of "
                             f"{context} + 1, fewer than one global batch of {global_batch}")
        self.context, self.global_batch, self.seed = context, global_batch, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.step = 0
        self._epoch, self._order = -1, None

    def _window_indices(self, positions: range) -> list[int]:
        """Window index at each position of the seeded stream (epoch after epoch)."""
        out = []
        for p in positions:
            epoch, i = divmod(p, self.windows)
            if epoch != self._epoch:
                g = torch.Generator().manual_seed(self.seed + epoch)
                self._epoch, self._order = epoch, torch.randperm(self.windows, generator=g)
            out.append(int(self._order[i]))
        return out

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's ``(inputs, targets)`` of ``step`` (a pure function of seed and step)."""
        local = self.global_batch // self.dp_size
        first = step * self.global_batch + self.dp_rank * local
        rows = [np.asarray(self.tokens[w * self.context:w * self.context + self.context + 1],
                           dtype=np.int64)
                for w in self._window_indices(range(first, first + local))]
        seq = torch.from_numpy(np.stack(rows))
        return seq[:, :-1], seq[:, 1:]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.batch(self.step)
        self.step += 1
        return out

    def tokens_per_step(self) -> int:
        """Tokens of one global batch (every rank's together)."""
        return self.global_batch * self.context

    def state_dict(self) -> dict:
        """The position and what it means (checked on load)."""
        return {"step": self.step, "seed": self.seed, "context": self.context,
                "global_batch": self.global_batch}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "context", "global_batch"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"loader state has {key}={int(state[key])}, this loader "
                                 f"{getattr(self, key)}: it would not continue the same order")
        self.step = int(state["step"])
