"""Submissions for ex00 that try to win their grade by tampering instead of summing.

Each is the text of an ``ex00_ring_sum.py``; ``{pidfile}`` is where a submission that
starts a process writes its pid (so a test can check that nothing it started survives).
Without its tampering, every one of them scores 0: its ``ring_sum`` zeroes its input and
returns it, which fails every ex00 test. Used by tests/test_grading_tamper.py.
"""

_ZEROES = '''
def ring_sum(tensor):
    return tensor.mul_(0)
'''

# The two lines of the issue: replace the comparisons the tests call.
PATCH_TESTING = '''
import torch
torch.testing.assert_close = lambda *args, **kwargs: None
torch.equal = lambda *args, **kwargs: True
''' + _ZEROES

# Find the report files on an ancestor's command line (--junitxml=, --json) and rewrite them
# to full marks: at exit, and from a detached process that keeps doing it for two minutes.
REWRITE_REPORT = '''
import atexit, json, os, re, time

def _ancestor_args():
    pid, args = os.getpid(), []
    while pid > 1:
        try:
            with open(f"/proc/{{pid}}/cmdline", "rb") as f:
                args += f.read().decode(errors="replace").split("\\0")
            with open(f"/proc/{{pid}}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return args

def _forge():
    args = _ancestor_args()
    for path in [a.split("=", 1)[1] for a in args if a.startswith("--junitxml=")]:
        try:
            text = open(path).read()
            text = re.sub(r"<(failure|error)\\b.*?(/>|</\\1>)", "", text, flags=re.S)
            open(path, "w").write(text)
        except OSError:
            pass
    for path in [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--json"]:
        try:
            rows = json.load(open(path))
            for r in rows:
                r.update(points=r["max_points"], passed=r["total"], first_failure="")
            json.dump(rows, open(path, "w"))
        except (OSError, ValueError):
            pass

atexit.register(_forge)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("{pidfile}", "w").write(str(os.getpid()))
        for _ in range(1200):
            _forge()
            time.sleep(0.1)
    os._exit(0)
''' + _ZEROES

# Return an object whose unpickling runs code in whichever process unpickles it.
UNPICKLE_RUNS_CODE = '''
import torch

class _Payload:
    def __reduce__(self):
        return (exec, ("import builtins, torch\\n"
                       "torch.testing.assert_close = lambda *a, **k: None\\n"
                       "builtins.all = lambda *a: True",))

def ring_sum(tensor):
    tensor.mul_(0)
    return _Payload()
'''

# The same, but bypassing the sandbox's own encoder: hand raw pickle bytes to the channel.
RAW_PICKLE = UNPICKLE_RUNS_CODE + '''
import pickle, sys
_codec = sys.modules.get("lecture_lib.grading.safe_load")
if _codec is not None:
    _codec.encode = lambda value: pickle.dumps(_Payload())
'''

# Kill the process group of the process that imported us (before: the grader itself).
KILL_PARENT_GROUP = '''
import os, signal
try:
    os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
except OSError:
    pass
''' + _ZEROES

# Allocate until something gives, at import (before: in the grader's own test process).
EXHAUST_MEMORY = '''
import torch

_hoard = []
while True:
    _hoard.append(torch.ones(2**26))          # 256 MiB at a time, every page touched
''' + _ZEROES

# Start a detached process (double fork, new session) that outlives the grade.
FORK_SURVIVOR = '''
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("{pidfile}", "w").write(str(os.getpid()))
        time.sleep(3600)
    os._exit(0)
''' + _ZEROES

# Flood stdout: 256 MiB at import.
FLOOD_STDOUT = '''
import sys
for _ in range(256):
    sys.stdout.write("x" * 2**20 + "\\n")
''' + _ZEROES

ROUTES = {
    "patch_testing": PATCH_TESTING,
    "rewrite_report": REWRITE_REPORT,
    "unpickle_runs_code": UNPICKLE_RUNS_CODE,
    "raw_pickle": RAW_PICKLE,
    "kill_parent_group": KILL_PARENT_GROUP,
    "exhaust_memory": EXHAUST_MEMORY,
    "fork_survivor": FORK_SURVIVOR,
    "flood_stdout": FLOOD_STDOUT,
}


# ----------------------------------------------------------------------------
# Wrong-but-plausible submissions: they compute, but not what the exercise asks
# ----------------------------------------------------------------------------
# Each is the text of a whole exercise file; tests/test_grading_answers.py grades them with
# the real command and checks that each scores less than full marks, with a first failure that
# names what is missing. The first group calls the library's answer (now refused); the second
# gets the numbers right and misses the exercise's point (now tested).

LIBRARY_ANSWER = {
    # the four-line answer of the issue: the library's own schedule, plus the ValueError check
    "ex06_interleaved_1f1b.py": '''
from lecture_lib.pipeline import make_schedule

def interleaved_1f1b(num_stages, microbatches, chunks):
    if chunks < 2 or microbatches % num_stages:
        raise ValueError("cannot interleave")
    return [list(a) for a in make_schedule("interleaved-1f1b", num_stages, microbatches,
                                           chunks).actions]
''',
    # the forbidden collective below the Python-level guard: the process group's own method
    "ex00_ring_sum.py": '''
import torch.distributed as dist

def ring_sum(tensor):
    out = tensor.clone()
    dist.distributed_c10d._get_default_group().allreduce([out]).wait()
    return out
''',
    # the library's ring, by alias and through its private phases
    "ex01_ring_allreduce.py": '''
import torch.distributed as dist
from lecture_lib import collectives

def reduce_scatter_(chunks):
    p = dist.get_world_size()
    collectives._reduce_scatter_chunks(chunks, dist.get_rank(), p, list(range(p)), None)

def all_gather_(chunks):
    p = dist.get_world_size()
    collectives._all_gather_chunks(chunks, dist.get_rank(), p, list(range(p)), None)

def ring_all_reduce(tensor):
    return getattr(collectives, "ring_all_reduce")(tensor.detach().clone())
''',
    # the library's bucketed DDP, subclassed
    "ex02_bucketed_ddp.py": '''
from lecture_lib.data_parallel import DDPBucketed

class BucketedDDP(DDPBucketed):
    def __init__(self, module, bucket_size_mb):
        if not bucket_size_mb > 0:
            raise ValueError("bucket_size_mb must be > 0")
        super().__init__(module, bucket_size_mb)
''',
    # the library's ZeRO optimizer, subclassed
    "ex03_zero1_optimizer.py": '''
from lecture_lib.zero import ShardedOptimizer as _ZeRO

class ShardedOptimizer(_ZeRO):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, **kwargs)
''',
    # the library's f, g and layers behind the exercise's names
    "ex05_tensor_parallel.py": '''
import torch.distributed as dist
import torch.nn as nn
from lecture_lib import tensor_parallel as tp

class CopyToTensorParallel:
    apply = staticmethod(tp.copy_to_tensor_parallel)

class ReduceFromTensorParallel:
    apply = staticmethod(tp.reduce_from_tensor_parallel)

class ColumnParallelLinear(nn.Module):
    def __init__(self, full):
        super().__init__()
        if full.out_features % dist.get_world_size():
            raise ValueError("out_features is not divisible by the ranks")
        self.inner = tp.ColumnParallelLinear.from_linear(full)
        self.weight, self.bias = self.inner.weight, self.inner.bias

    def forward(self, x):
        return self.inner(x)

class RowParallelLinear(nn.Module):
    def __init__(self, full):
        super().__init__()
        if full.in_features % dist.get_world_size():
            raise ValueError("in_features is not divisible by the ranks")
        self.inner = tp.RowParallelLinear.from_linear(full)
        self.weight, self.bias = self.inner.weight, self.inner.bias

    def forward(self, x):
        return self.inner(x)
''',
    # the library's count exchange (one all-gather of the count table)
    "ex08_moe_dispatch.py": '''
from dataclasses import dataclass
from types import SimpleNamespace
import torch
import torch.distributed as dist
from lecture_lib.expert_parallel import all_to_all, exchange_counts

@dataclass
class Plan:
    order: torch.Tensor
    send_splits: list
    recv_splits: list

def dispatch(x, expert_index, num_experts, group=None):
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    local = num_experts // p
    counts = torch.bincount(expert_index, minlength=num_experts).view(1, -1)
    table, _ = exchange_counts(SimpleNamespace(counts=counts, counts_all=None,
                                               probs=torch.zeros(len(x), num_experts)), group)
    recv = torch.tensor(table)[:, 0, rank * local:(rank + 1) * local]
    send_splits, recv_splits = counts.view(p, local).sum(1).tolist(), recv.sum(1).tolist()
    order = expert_index.argsort(stable=True)
    received = all_to_all(x[order], send_splits, recv_splits, group)
    experts = torch.arange(rank * local, (rank + 1) * local).repeat(p)
    return received, experts.repeat_interleave(recv.flatten()), Plan(order, send_splits,
                                                                      recv_splits)

def combine(processed, plan, group=None):
    back = all_to_all(processed, plan.recv_splits, plan.send_splits, group)
    return back[plan.order.argsort()]
''',
    # the library's memory model
    "ex04_memory_per_device.py": '''
from lecture_lib import costmodel

def memory_per_device(num_params, layers, hidden, heads, seq_len, microbatch_size, dp=1, tp=1,
                      pp=1, zero_stage=0, recompute="none"):
    shape = costmodel.TransformerShape("mine", layers, hidden, heads, 50257, seq_len, num_params)
    return costmodel.memory_per_device(shape, dp=dp, tp=tp, pp=pp, zero_stage=zero_stage,
                                       microbatch_size=microbatch_size, recompute=recompute)
''',
    # the library's exchange, under the exercise's own name
    "ex07_pipeline_exchange.py": '''
from lecture_lib.pipeline.execute import exchange
''',
    # the library's grid arithmetic and groups
    "ex09_rank_grid.py": '''
import torch.distributed as dist
from lecture_lib.mesh import grid_coordinates as coordinates, grid_groups

def build_groups(dims):
    mine = {}
    for name in dims:
        for ranks in grid_groups(dims, name):
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine[name] = group
    return mine
''',
    # the library's consistency check
    "ex10_gradient_consistency.py": '''
from lecture_lib.debugging import check_gradient_consistency

def first_inconsistent(model, atol=1e-6):
    found = check_gradient_consistency(model, rtol=0.0, atol=atol)
    if found is None:
        return None
    kind = "grad" if found.kind == "missing grad" else found.kind
    return found.name, kind, found.max_abs_diff
''',
    # the library's gradient sync
    "ex11_fix_ddp_step.py": '''
import torch.distributed as dist
from lecture_lib.debugging import sync_gradients

def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = model(x, y)
    loss.backward()
    sync_gradients(model)
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()
''',
    # the library's merge and ring shift
    "ex13_ring_attention.py": '''
import math
import torch
import torch.distributed as dist
from lecture_lib.context_parallel import merge, ring_shift

def block_attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse

def ring_step(q, kv, state):
    wait = ring_shift(kv)
    part = block_attention(q, kv[0], kv[1])
    state = part if state is None else merge(*state, *part)
    return state, wait()

def ring_attention(q, k, v):
    kv, state = torch.stack([k, v]), None
    for _ in range(dist.get_world_size()):
        state, kv = ring_step(q, kv, state)
    return state[0]
''',
    # the library's two-stream step and its ring cost
    "ex14_ddp_step_time.py": '''
from lecture_lib import costmodel

def ring_all_reduce_seconds(nbytes, world_size, alpha, beta):
    if nbytes < 0 or world_size < 1 or alpha < 0 or not beta > 0:
        raise ValueError("bad input")
    link = costmodel.Link("mine", alpha, beta)
    return costmodel.collective_time("all_reduce", nbytes, world_size, link)

def bucketed_step_seconds(forward, backward_per_bucket, bucket_bytes, optimizer, world_size,
                          alpha, beta):
    if not backward_per_bucket or len(backward_per_bucket) != len(bucket_bytes):
        raise ValueError("one backward time per bucket")
    if min([forward, optimizer, *backward_per_bucket, *bucket_bytes]) < 0:
        raise ValueError("negative")
    ready, t = [], forward
    for b in backward_per_bucket:
        t += b
        ready.append(t)
    comm = [ring_all_reduce_seconds(n, world_size, alpha, beta) for n in bucket_bytes]
    return costmodel.two_stream_step(ready, comm, ready[-1], optimizer)
''',
}
