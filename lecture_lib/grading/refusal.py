"""The library's answer to an exercise, refused to the submission (DESIGN.md, principle 9).

Before a submission's module runs in its sandboxed child (and on each rank the
child starts), :func:`refuse` makes the library's functions and classes that
*are* the answer (named per exercise in :data:`lecture_lib.grading.answers.ANSWERS`)
raise :class:`LibraryAnswerRefused` when the submission's code calls them, directly
or through any alias, ``getattr``, a subclass or another library function;
the tests' own code keeps using them. The function object itself refuses (its
code is swapped for a check, so every reference to it does), in its module and
wherever it is re-exported, also after a reload. Where an exercise allows
point-to-point messages only, :mod:`.collective_refusal` refuses every collective
too.

"The submission's code" is a frame of its file on the calling thread's stack
(above any import the submission started: a library module's own import code is
not the submission's), a call the tests make through the exercise's module
(``ex.ring_sum``: also when that name *is* the library's function), and any
thread the submission started. Out of reach: a submission that copies the
library's code into its own file (the library is there to read), that loads a
second copy of a library file under another name, that digs the original
functions out of this module, or that talks to the other ranks by a channel of
its own (files, sockets) instead of torch.distributed.
"""
from __future__ import annotations

import _thread
import importlib
import inspect
import os
import sys
import threading
import types
from contextlib import contextmanager


class LibraryAnswerRefused(AssertionError):
    """The submission called what its exercise asks it to write (one line: which call, why)."""


_SUBMISSION: dict = {}               # exercise, path, module, what, targets (module -> names)
_LOCAL = threading.local()           # depth, entry: a call the tests make into the submission
_GUARDS: list = []                   # the checks the refusing functions' code calls
_TRAMPOLINE = "<lecture_lib: refused to the submission>"


@contextmanager
def entered(name: str):
    """A call the tests make into the submission (``ex.name(...)``): its code, whatever it is."""
    depth = getattr(_LOCAL, "depth", 0)
    outer = getattr(_LOCAL, "entry", None)
    _LOCAL.depth, _LOCAL.entry = depth + 1, outer or name
    try:
        yield
    finally:
        _LOCAL.depth, _LOCAL.entry = depth, outer


def submission_frame(frame, immediate: bool = False):
    """The submission's innermost frame on the stack from ``frame`` up; True where the
    submission runs without a frame of its own (called through the exercise's module, or on a
    thread it started); None where the call is not the submission's."""
    if not _SUBMISSION:
        return None
    path, module = _SUBMISSION["path"], _SUBMISSION["module"]
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if name == path or f.f_globals.get("__name__") == module:
            return f
        if immediate or name.startswith("<frozen importlib"):
            return None          # a module being imported runs its own code, not the submission's
        f = f.f_back
    if getattr(_LOCAL, "depth", 0) or getattr(threading.current_thread(),
                                               "_lecture_submission", False):
        return True
    return None


def refusal_message(call: str, why: str, where, who: str | None = None) -> str:
    """One line: who called what, where, and why that is not allowed."""
    ex = _SUBMISSION["exercise"]
    if where is True:
        entry = getattr(_LOCAL, "entry", None)
        who = who or (f"your {entry} (through a name, alias or object the tests call)" if entry
                      else "a thread your code started")
        return f"{ex}: {who} calls {call}, which is not allowed: {why}. Write it yourself."
    line = (inspect.getframeinfo(where).code_context or [""])[0].strip()
    place = f"{os.path.basename(where.f_code.co_filename)} line {where.f_lineno}"
    return (f"{ex}: your code calls {call} ({place}), which is not allowed: {why}. Write it "
            f"yourself." + (f" [line {where.f_lineno}: {line[:100]}]" if line else ""))


def _of_submission(obj) -> bool:
    """An object of a class the submission defined (or such a class itself)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(getattr(c, "__module__", None) == _SUBMISSION["module"] for c in cls.__mro__)


def _type_name(obj) -> str:
    return (obj if isinstance(obj, type) else type(obj)).__name__


def _trampoline(free: int, key: int):
    """Code that calls ``_GUARDS[key]``, with ``free`` free variables (a function's code may be
    swapped only for code with as many as its closure has cells)."""
    cells = [f"_c{i}" for i in range(free)]
    lines = ["def _outer():", *(f"    {c} = None" for c in cells),
             "    def _refusing(*args, **kwargs):"]
    if cells:
        lines.append(f"        if __lecture_never__: ({', '.join(cells)},)")
    lines += [f"        return __lecture_guards__[{key}](*args, **kwargs)", "    return _refusing"]
    namespace: dict = {}
    exec(compile("\n".join(lines), _TRAMPOLINE, "exec"), namespace)
    return namespace["_outer"]().__code__


def _guard_function(fn, call: str, why: str) -> None:
    """Make ``fn`` itself refuse the submission (every reference to it, wherever kept)."""
    while not isinstance(fn, types.FunctionType) and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    if not isinstance(fn, types.FunctionType) or fn.__code__.co_filename == _TRAMPOLINE:
        return
    body = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    body.__kwdefaults__, body.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    body.__module__, body.__doc__ = fn.__module__, fn.__doc__

    def check(*args, **kwargs):
        where, who = submission_frame(sys._getframe(2)), None
        if where is None and args and _of_submission(args[0]):
            # a library method borrowed by, or inherited into, a class of the submission
            where, who = True, f"your {_type_name(args[0])} (a class of your module)"
        if where is not None:
            raise LibraryAnswerRefused(refusal_message(call, why, where, who))
        return body(*args, **kwargs)

    try:
        fn.__signature__ = inspect.signature(body)
    except (TypeError, ValueError):
        pass
    fn.__globals__["__lecture_guards__"], fn.__globals__["__lecture_never__"] = _GUARDS, False
    _GUARDS.append(check)
    fn.__code__ = _trampoline(len(fn.__closure__ or ()), len(_GUARDS) - 1)


def _guard(obj, call: str, why: str) -> None:
    """A function, or every method of a class (so that constructing it or calling any of its
    methods refuses: a subclass too)."""
    if not isinstance(obj, type):
        _guard_function(obj, call, why)
        return
    for value in list(vars(obj).values()):
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        parts = (value.fget, value.fset, value.fdel) if isinstance(value, property) else (value,)
        for part in parts:
            if part is not None and not isinstance(part, type):
                _guard_function(part, call, why)


def _guard_module(module) -> None:
    for name in _SUBMISSION["targets"].get(module.__name__, ()):
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            _guard(obj, f"{module.__name__}.{name}", _SUBMISSION["why"])


class _GuardingLoader:
    """A module's own loader, then the guards (on its first import and on every reload)."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _guard_module(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _GuardOnImport:
    """First on ``sys.meta_path``: a module holding a refused call gets guarded as it runs."""

    def find_spec(self, name, path=None, target=None):
        if name not in _SUBMISSION["targets"]:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _GuardingLoader(spec.loader)
                return spec
        return None


def _watch_threads() -> None:
    """A thread the submission starts runs the submission's code, whatever its stack shows."""
    start, new_thread = threading.Thread.start, _thread.start_new_thread

    def thread_start(self):
        if submission_frame(sys._getframe(1)) is not None:
            self._lecture_submission = True
        return start(self)

    def start_new_thread(function, args, kwargs=None):
        if submission_frame(sys._getframe(1)) is not None:
            inner = function

            def function(*a, **k):
                _LOCAL.depth, _LOCAL.entry = 1, None
                return inner(*a, **k)
        return new_thread(function, args, kwargs or {})

    threading.Thread.start, _thread.start_new_thread = thread_start, start_new_thread


def refuse(exercise: str, path: str, module: str, why: str, calls=()) -> None:
    """Before ``exercise``'s submission (file ``path``, module ``module``) runs in this process:
    ``calls`` (``"package.module:name"``) refuse it, saying ``why``. Once per process.
    (:func:`.collective_refusal.refuse_collectives` refuses every collective too.)"""
    if _SUBMISSION:
        return
    targets: dict = {}
    for call in calls:
        mod, _, name = call.partition(":")
        targets.setdefault(mod, []).append(name)
    _SUBMISSION.update(exercise=exercise, path=str(path), module=module, why=why,
                       targets=targets)
    sys.meta_path.insert(0, _GuardOnImport())
    for name in targets:
        if name in sys.modules:
            _guard_module(sys.modules[name])
    _watch_threads()
    importlib.invalidate_caches()
