# Generated from solutions/ex04_memory_per_device.py by `python -m lecture_lib.grading stubs`.
# Students: fill in every NotImplementedError below, then check your work with
#   python -m lecture_lib.grading grade exercises/ex04_memory_per_device.py
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
    raise NotImplementedError("ex04: your code here")
