"""Memory per device: model states (ZeRO) and activations (Korthikanti et al.).

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", section 3.1 and Figure 1). Mixed-precision
Adam keeps, per parameter, 2 bytes of fp16/bf16 parameters, 2 bytes of
gradients and K = 12 bytes of optimizer state (fp32 master weights, momentum
and variance). With ``Nd`` data-parallel ranks and Psi parameters:

    stage 0 (plain DP)       (2 + 2 + K) Psi
    stage 1 (P_os)            2 Psi + 2 Psi + K Psi / Nd
    stage 2 (P_os+g)          2 Psi + (2 + K) Psi / Nd
    stage 3 (P_os+g+p)       (2 + 2 + K) Psi / Nd

7.5B parameters on 64 GPUs give 120, 31.4, 16.6 and 1.9 GB (the paper's
Figure 1). Tensor and pipeline parallelism divide Psi first (each device holds
``1 / (tp * pp)`` of the layers' weights).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", Table 2): bytes one transformer layer stores for
backward, with 16-bit activations, sequence length s, micro-batch b, hidden
size h, a heads and tensor-parallel size t:

    no parallelism                    s b h (34 + 5 a s / h)
    tensor parallel                   s b h (10 + 24 / t + 5 a s / (h t))
    tensor + sequence parallel        s b h (34 / t + 5 a s / (h t))
    selective recomputation           the 5 a s / h term (attention scores) dropped
    full recomputation                2 s b h (the layer's input only; / t with sp)

Under 1F1B pipelining the first stage holds ``pp`` micro-batches of ``L / pp``
layers, i.e. ``L`` layers' worth whatever ``pp`` is (the paper, section 4.2).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full")
GB = 1e9


def _check_size(name: str, value, minimum: float = 1, integer: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if integer and value != int(value):
        raise ValueError(f"{name} must be a whole number, not {value!r}")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")


def check_zero_stage(stage) -> int:
    """The stage as an int, or a clear ValueError for anything but 0, 1, 2, 3."""
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"unknown ZeRO stage {stage!r}; known stages: 0 (none), "
                         "1 (optimizer state), 2 (+ gradients), 3 (+ parameters)")
    return int(stage)


def model_state_breakdown(num_params, dp_size: int = 1, zero_stage: int = 0,
                          optimizer_bytes_per_param: float = 12, param_bytes: float = 2,
                          grad_bytes: float = 2) -> dict:
    """Bytes of parameters, gradients and optimizer state one data-parallel rank holds."""
    _check_size("num_params", num_params, 0, integer=False)
    _check_size("dp_size", dp_size)
    stage = check_zero_stage(zero_stage)
    for name, v in (("optimizer_bytes_per_param", optimizer_bytes_per_param),
                    ("param_bytes", param_bytes), ("grad_bytes", grad_bytes)):
        _check_size(name, v, 0, integer=False)
    params = num_params * param_bytes / (dp_size if stage >= 3 else 1)
    grads = num_params * grad_bytes / (dp_size if stage >= 2 else 1)
    optimizer = num_params * optimizer_bytes_per_param / (dp_size if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "total": params + grads + optimizer}


def model_state_bytes(num_params, dp_size: int = 1, zero_stage: int = 0,
                      optimizer_bytes_per_param: float = 12, param_bytes: float = 2,
                      grad_bytes: float = 2) -> float:
    """Bytes of model states per rank (ZeRO paper, Figure 1); see :func:`model_state_breakdown`.

    >>> round(model_state_bytes(7.5e9, 64, 1) / 1e9, 1)
    31.4
    """
    return model_state_breakdown(num_params, dp_size, zero_stage, optimizer_bytes_per_param,
                                 param_bytes, grad_bytes)["total"]


def activation_bytes_per_layer(seq_len: int, microbatch_size: int, hidden: int, heads: int,
                               tp: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> float:
    """Bytes one transformer layer keeps for backward (Korthikanti et al. 2022, Table 2)."""
    for name, v in (("seq_len", seq_len), ("microbatch_size", microbatch_size), ("hidden", hidden),
                    ("heads", heads), ("tp", tp)):
        _check_size(name, v)
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    s, b, h, a, t = seq_len, microbatch_size, hidden, heads, tp
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34 / t + scores)
    return sbh * (10 + 24 / t + scores)


@dataclass(frozen=True)
class TransformerShape:
    """The sizes the memory model needs; ``num_params`` defaults to the usual estimate.

    ``embedding_params``: the weights of embedding tables a token only looks up (a position
    table; a token table not tied to the head), in ``num_params`` but not in the N of the
    compute, :attr:`matmul_params`. The default estimate has none: its one ``V h`` table is
    the head's."""
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    num_params: float = 0.0
    embedding_params: float = 0.0

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "vocab", "seq_len"):
            _check_size(f"{self.name}.{field}", getattr(self, field))
        if not self.num_params:
            # 12 L h^2 for attention + MLP weights, 13 L h for biases and norms, V h embedding
            # (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training ...", eq. 2)
            object.__setattr__(self, "num_params", 12 * self.layers * self.hidden ** 2
                               + 13 * self.layers * self.hidden + self.vocab * self.hidden)
        if not 0 <= self.embedding_params < self.num_params:
            raise ValueError(f"{self.name}.embedding_params must be >= 0 and less than its "
                             f"{self.num_params:g} parameters, not {self.embedding_params!r}")

    @property
    def matmul_params(self) -> float:
        """N: the weights a token's matmuls use (a tied head counted once, as the head)."""
        return self.num_params - self.embedding_params


PRESETS = {
    # GPT-3 175B: Brown et al. 2020, Table 2.1 (96 layers, d_model 12288, 96 heads, 2048 tokens)
    # its token table is its head (tied); the 2048 x 12288 learned positions are looked up
    "GPT-3 175B": TransformerShape("GPT-3 175B", 96, 12288, 96, 50257, 2048, 175e9,
                                   2048 * 12288),
    # Llama 3 8B / 70B: Meta's model cards (32 x 4096, 80 x 8192; vocab 128256; 8192 tokens)
    # (untied token tables, rotary positions: the token table is looked up)
    "Llama-style 8B": TransformerShape("Llama-style 8B", 32, 4096, 32, 128256, 8192, 8.0e9,
                                       128256 * 4096),
    "Llama-style 70B": TransformerShape("Llama-style 70B", 80, 8192, 64, 128256, 8192, 70.6e9,
                                        128256 * 8192),
    # the course's small GPT (lecture_lib.models.GPTConfig defaults), its exact count
    "course small GPT": TransformerShape("course small GPT", 4, 64, 4, 64, 32, 210_304,
                                         (64 + 32) * 64),   # untied head, learned positions
}

PRECISIONS = {
    # bytes per parameter: (params, grads, optimizer state) for Adam
    "mixed (bf16/fp16 + fp32 master)": (2, 2, 12),
    "fp32": (4, 4, 8),
    # torch.autocast: fp32 weights, gradients and Adam state; matmuls and activations in bf16
    "autocast (bf16 compute, fp32 weights)": (4, 4, 8),
}
ACTIVATION_BYTES = {"mixed (bf16/fp16 + fp32 master)": 2, "fp32": 4,
                    "autocast (bf16 compute, fp32 weights)": 2}


def memory_per_device(shape: TransformerShape, dp: int = 1, tp: int = 1, pp: int = 1,
                      zero_stage: int = 0, microbatch_size: int = 1, seq_len: int | None = None,
                      recompute: str = "none", sequence_parallel: bool = False,
                      precision: str = "mixed (bf16/fp16 + fp32 master)") -> dict:
    """Bytes on one device, by kind: params, grads, optimizer, activations, total.

    Model states: Psi / (tp * pp) parameters per model replica slice, then
    ZeRO over ``dp``. Activations: ``layers`` layers' worth (1F1B's first
    stage) of :func:`activation_bytes_per_layer` (16-bit activations; doubled
    for fp32). ``precision``: a key of :data:`PRECISIONS`; under autocast the states
    are fp32's and the activations 16-bit.
    """
    if not isinstance(shape, TransformerShape):
        raise TypeError(f"shape must be a TransformerShape, not {type(shape).__name__}")
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp), ("microbatch_size", microbatch_size)):
        _check_size(name, v)
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, not {precision!r}")
    if shape.layers % pp:
        raise ValueError(f"{shape.layers} layers do not split into pp={pp} equal stages")
    if shape.heads % tp:
        raise ValueError(f"{shape.heads} heads do not split over tp={tp}")
    p_bytes, g_bytes, k = PRECISIONS[precision]
    states = model_state_breakdown(shape.num_params / (tp * pp), dp, zero_stage, k, p_bytes,
                                   g_bytes)
    per_layer = activation_bytes_per_layer(seq_len or shape.seq_len, microbatch_size, shape.hidden,
                                           shape.heads, tp, sequence_parallel, recompute)
    activations = per_layer * shape.layers * (ACTIVATION_BYTES[precision] / 2)
    out = {k_: states[k_] for k_ in ("params", "grads", "optimizer")}
    out["activations"] = activations
    out["total"] = sum(out.values())
    return out


def min_devices_for_states(num_params, zero_stage: int, device_bytes: float = 80 * GB,
                           optimizer_bytes_per_param: float = 12, param_bytes: float = 2,
                           grad_bytes: float = 2, max_devices: int = 1 << 20) -> int | None:
    """Fewest data-parallel devices whose per-device model states fit; None if none does.

    Only stage 3 divides everything; stages 0-2 keep a full copy of the
    parameters (and stage 0-1 of the gradients), which may never fit.
    """
    _check_size("device_bytes", device_bytes, 1, integer=False)
    stage = check_zero_stage(zero_stage)
    floor = model_state_bytes(num_params, max_devices, stage, optimizer_bytes_per_param,
                              param_bytes, grad_bytes)
    if floor > device_bytes:
        return None
    lo, hi = 1, max_devices
    while lo < hi:
        mid = (lo + hi) // 2
        if model_state_bytes(num_params, mid, stage, optimizer_bytes_per_param, param_bytes,
                             grad_bytes) <= device_bytes:
            hi = mid
        else:
            lo = mid + 1
    return lo
