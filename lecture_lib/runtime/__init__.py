"""Running one function on N ranks: the launcher and what it stands on.

:func:`run` (:mod:`.launch`) is the entry point; :mod:`.pool` keeps warm workers
(:mod:`.worker`, forked by :mod:`.zygote` from :mod:`.zygote_server`) and talks
to them in the typed messages of :mod:`.protocol`; :mod:`.magic` is the
``%%ranks`` cell magic over :func:`run`. Nothing here imports the rest of the
library: every parallelism scheme imports this package, never the other way.
"""
from .launch import (
    DEFAULT_TIMEOUT,
    RankError,
    RankTimeout,
    choose_backend,
    device,
    run,
    shutdown,
    torchrun_main,
    worker_pids,
)

__all__ = ["run", "device", "choose_backend", "shutdown", "worker_pids", "torchrun_main",
           "RankError", "RankTimeout", "DEFAULT_TIMEOUT"]
