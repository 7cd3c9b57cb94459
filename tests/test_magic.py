"""%%ranks: a cell on N ranks through lecture_lib.run, in a real IPython shell (no browser)."""
import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import get_ipython

import lecture_lib
from lecture_lib.runtime import launch, magic

CELL = """
t = torch.tensor([x * (rank + 1.0)], device=device)
dist.all_reduce(t)
y = t.item()
z = [rank] * scale
(rank, world_size, str(device), y)
"""


@pytest.fixture(scope="module")
def shell():
    ip = get_ipython()
    ip.run_line_magic("load_ext", "lecture_lib.runtime.magic")
    yield ip
    launch.shutdown()


def test_a_cell_on_two_ranks_with_in_and_out(shell):
    shell.user_ns.update(x=2.0, scale=3)
    shell.user_ns.pop("y", None)
    values = shell.run_cell_magic("ranks", "2 --in x,scale --out y,z --timeout 120", CELL)
    # the same all-reduce in one process: 2 * 1 + 2 * 2
    assert values == [(0, 2, "cpu", 6.0), (1, 2, "cpu", 6.0)]
    assert shell.user_ns["y"] == [6.0, 6.0]
    assert shell.user_ns["z"] == [[0, 0, 0], [1, 1, 1]]


def test_the_cell_syntax_runs_through_the_shell(shell):
    result = shell.run_cell("%%ranks 2 --timeout 120\nw = rank * 10\nw + world_size\n")
    result.raise_error()
    assert result.result == [2, 12]
    assert shell.run_cell("%%ranks 2 --timeout 120\nw = rank\n").result is None  # no value


def test_a_rank_that_raises_gives_rank_error_and_no_process_stays(shell):
    cell = "if rank == 1:\n    raise ValueError('boom on one rank')\nrank\n"
    with pytest.raises(lecture_lib.RankError, match="boom on one rank") as info:
        shell.run_cell_magic("ranks", "2 --timeout 120", cell)
    assert info.value.rank == 1
    assert "raise ValueError('boom on one rank')" in info.value.traceback   # the cell's line
    assert launch.worker_pids(2) == []
    assert shell.run_cell_magic("ranks", "2 --timeout 120", "rank") == [0, 1]  # starts clean


def test_a_hang_gives_rank_timeout_with_the_stack(shell):
    cell = "import time\nif rank == 0:\n    time.sleep(600)\nrank\n"
    with pytest.raises(lecture_lib.RankTimeout) as info:
        shell.run_cell_magic("ranks", "2 --timeout 4", cell)
    assert "%%ranks cell>\", line 3" in str(info.value)          # the sleep, in the cell
    assert 0 in info.value.stacks
    assert launch.worker_pids(2) == []


def test_bad_input_is_refused_before_any_process_starts(shell, monkeypatch):
    def no_ranks(*args, **kwargs):
        raise AssertionError("no rank should start")

    monkeypatch.setattr(launch, "run", no_ranks)
    shell.user_ns.pop("never_defined", None)
    with pytest.raises(UsageError, match="never_defined"):
        shell.run_cell_magic("ranks", "2 --in never_defined", "rank")
    with pytest.raises(UsageError, match="variable names"):
        shell.run_cell_magic("ranks", "2 --out 1x", "rank")
    with pytest.raises(SyntaxError):
        shell.run_cell_magic("ranks", "2", "def broken(:\n")
    with pytest.raises(UsageError):
        shell.run_cell_magic("ranks", "two", "rank")


def test_an_out_name_the_cell_did_not_define_is_a_rank_error(shell):
    with pytest.raises(lecture_lib.RankError, match="did not define"):
        shell.run_cell_magic("ranks", "2 --out nothing_here --timeout 120", "rank")


def test_the_magic_without_ipython():
    values, outs = magic.run_ranks("q = rank ** 2\nq + 1", 2, outputs=["q"], timeout=120)
    assert values == [1, 2] and outs == {"q": [0, 1]}
