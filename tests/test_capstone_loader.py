"""The capstone loader: deterministic, resumable, and its dp shards make the global batch."""
import numpy as np
import pytest
import torch

from lecture_lib.capstone.loader import TokenLoader

VOCAB, N_TOKENS = 1000, 4001


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    rng = np.random.default_rng(0)
    rng.integers(0, VOCAB, N_TOKENS, dtype=np.uint16).tofile(path)
    return path


def test_windows_are_the_file_shifted_by_one(token_file):
    ld = TokenLoader(token_file, context=16, global_batch=4)
    arr = np.fromfile(token_file, dtype=np.uint16).astype(np.int64)
    x, y = ld.batch(0)
    assert x.dtype == torch.int64 and x.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in torch.cat([x, y[:, -1:]], 1):
        starts = [s for s in range(0, len(arr) - 16, 16) if np.array_equal(arr[s:s + 17], row)]
        assert starts, f"{row.tolist()} is not a window of the file at a multiple of 16"


def test_deterministic_and_seed_dependent(token_file):
    a = [TokenLoader(token_file, 16, 4, seed=3).next_batch()[0] for _ in range(2)]
    assert torch.equal(a[0], a[1])
    b = TokenLoader(token_file, 16, 4, seed=4).batch(0)[0]
    assert not torch.equal(a[0], b)


def test_every_window_once_per_epoch(token_file):
    ld = TokenLoader(token_file, 16, 10)
    per_epoch = ld.windows // 10
    firsts = torch.cat([ld.batch(s)[0] for s in range(per_epoch)])
    assert len({tuple(r.tolist()) for r in firsts}) == per_epoch * 10   # no window twice


def test_resumption_equals_uninterrupted(token_file):
    straight = TokenLoader(token_file, 16, 8, seed=1)
    expected = [straight.next_batch()[0] for _ in range(40)]    # an epoch is 31 steps here
    first = TokenLoader(token_file, 16, 8, seed=1)
    got = [first.next_batch()[0] for _ in range(11)]
    resumed = TokenLoader(token_file, 16, 8, seed=1)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next_batch()[0] for _ in range(29)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    with pytest.raises(ValueError, match="seed=1, this loader 2"):
        TokenLoader(token_file, 16, 8, seed=2).load_state_dict(first.state_dict())


@pytest.mark.parametrize("dp", [2, 4])
def test_dp_shards_union_is_the_global_batch(token_file, dp):
    whole = TokenLoader(token_file, 16, 8, seed=5)
    shards = [TokenLoader(token_file, 16, 8, seed=5, dp_rank=r, dp_size=dp) for r in range(dp)]
    for step in (0, 7, 40):
        x, y = whole.batch(step)
        parts = [s.batch(step) for s in shards]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_array_input_and_bad_input(token_file):
    arr = np.fromfile(token_file, dtype=np.uint16)
    from_file = TokenLoader(token_file, 16, 4).batch(2)[0]
    assert torch.equal(TokenLoader(arr, 16, 4).batch(2)[0], from_file)
    with pytest.raises(ValueError, match="does not split over dp=3"):
        TokenLoader(arr, 16, 8, dp_size=3)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        TokenLoader(arr[:100], 16, 8)
    with pytest.raises(ValueError, match="does not exist"):
        TokenLoader(token_file.with_name("missing.bin"), 16, 8)
