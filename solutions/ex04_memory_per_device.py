"""Exercise 04: how many bytes one device holds when training a transformer.

Write ``memory_per_device(num_params, layers, hidden, heads, seq_len,
microbatch_size, dp=1, tp=1, pp=1, zero_stage=0, recompute="none")`` returning a
dict with the bytes of ``"params"``, ``"grads"``, ``"optimizer"``,
``"activations"`` and their ``"total"``, for mixed-precision Adam:

* model states (Rajbhandari et al. 2020, the ZeRO paper, section 3.1): each
  device holds ``num_params / (tp * pp)`` parameters' worth; per parameter 2
  bytes of 16-bit weights, 2 of gradients, 12 of optimizer state; ZeRO stage
  1 divides the optimizer state by ``dp``, stage 2 the gradients too, stage 3
  the parameters too;
* activations (Korthikanti et al. 2022, Table 2, tensor parallel without
  sequence parallelism): per layer ``s b h (10 + 24/t + 5 a s / (h t))``
  bytes, without the last term under ``recompute="selective"``, and
  ``2 s b h`` under ``recompute="full"``; the device holds ``layers`` layers'
  worth (1F1B pipelining keeps ``pp`` micro-batches of ``layers/pp`` layers on
  the first stage).

Raise ``ValueError`` for a ZeRO stage other than 0-3, an unknown recompute
mode, or any size below 1.
"""


def memory_per_device(num_params, layers, hidden, heads, seq_len, microbatch_size, dp=1, tp=1,
                      pp=1, zero_stage=0, recompute="none"):
    # BEGIN SOLUTION
    for name, v in (("num_params", num_params), ("layers", layers), ("hidden", hidden),
                    ("heads", heads), ("seq_len", seq_len), ("microbatch_size", microbatch_size),
                    ("dp", dp), ("tp", tp), ("pp", pp)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, not {v}")
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        raise ValueError(f"unknown ZeRO stage {zero_stage!r}")
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"unknown recompute mode {recompute!r}")
    psi = num_params / (tp * pp)
    params = 2 * psi / (dp if zero_stage >= 3 else 1)
    grads = 2 * psi / (dp if zero_stage >= 2 else 1)
    optimizer = 12 * psi / (dp if zero_stage >= 1 else 1)
    s, b, h, a, t = seq_len, microbatch_size, hidden, heads, tp
    if recompute == "full":
        per_layer = 2 * s * b * h
    else:
        per_layer = s * b * h * (10 + 24 / t)
        if recompute == "none":
            per_layer += s * b * h * 5 * a * s / (h * t)
    activations = per_layer * layers
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "activations": activations, "total": params + grads + optimizer + activations}
    # END SOLUTION
