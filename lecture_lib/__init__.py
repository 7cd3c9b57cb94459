"""lecture_lib: the support library of the Parallelism Basics course pack.

Every parallelism scheme the course teaches, implemented for real on
``torch.distributed`` and measured. Start with :func:`run`, which runs a
function on N ranks (one OS process each) and returns their results.
"""
import sys

from .runtime import RankError, RankTimeout, device, run, shutdown

__all__ = ["run", "RankError", "RankTimeout", "device", "shutdown"]

if "IPython" in sys.modules:                 # in a notebook or IPython: %%ranks is ready
    from .runtime import magic

    magic.register_if_in_ipython()
