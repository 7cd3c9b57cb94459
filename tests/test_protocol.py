"""lecture_lib.runtime.protocol: every message survives the wire as itself; nothing else crosses."""
import dataclasses
import subprocess
import sys

import pytest

from lecture_lib.runtime import protocol
from lecture_lib.runtime.protocol import (
    Failure,
    Forked,
    ForkRequest,
    Hello,
    Job,
    Result,
    Returned,
    Unsendable,
    WorkerExited,
    ZygoteReady,
    pack,
    unpack,
)

EXAMPLES = [Hello(3), Job(7, b"\x80fn", ("/a", "/b"), "/tmp", 180.0, True), Returned(False),
            Result(b"\x80value"), Unsendable("Traceback ..."), Failure("Traceback ..."),
            ZygoteReady(1), ForkRequest({"A": "1"}, "/tmp/rank0.log", "/tmp"), Forked(1234),
            WorkerExited(1234, -9)]


def test_every_message_round_trips_as_itself():
    assert {type(m) for m in EXAMPLES} == set(protocol.MESSAGES.values())
    for message in EXAMPLES:
        again = unpack(pack(message))
        assert type(again) is type(message) and again == message
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(again, dataclasses.fields(again)[0].name, None)


def test_only_the_protocols_messages_cross():
    @dataclasses.dataclass(frozen=True)
    class Hello:                          # the same name, not the protocol's class
        rank: int
    for stranger in (("ok", b""), Hello(0), "returned"):
        with pytest.raises(TypeError, match="not a message of the runtime's protocol"):
            pack(stranger)


def test_the_protocol_needs_nothing_but_the_standard_library():
    """The zygote loads it by path without importing lecture_lib or torch."""
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('p', "
            "sys.argv[1]); m = importlib.util.module_from_spec(spec); sys.modules['p'] = m; "
            "spec.loader.exec_module(m); assert m.unpack(m.pack(m.Forked(5))) == m.Forked(5); "
            "print(sorted(n for n in sys.modules if n.startswith(('lecture_lib', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code, protocol.__file__], capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["[]"], out.stderr
