"""ex07: exchange(), the step that sends an activation forward and a gradient back,
alone and inside the real pipeline executor (equal to one-process training)."""
import pytest
import torch
import torch.distributed as dist

from lecture_lib import pipeline as pp
from lecture_lib.grading import assert_close_per_rank, load_exercise
from lecture_lib.models import GPT, GPTConfig, MarkovText, lm_loss
from lecture_lib.pipeline import experiments as ppx

ex = load_exercise("ex07")
POINTS = 10
CFG = GPTConfig(vocab_size=32, seq_len=16, d_model=32, n_heads=2, n_layers=4)


def _both_directions():
    """Stage 0 sends an activation forward while stage 1 sends a gradient back."""
    rank = dist.get_rank()
    peer = 1 - rank
    mine = torch.full((3, 4), float(rank + 1))
    got = torch.zeros(3, 4)
    requests = ex.exchange([(mine, peer)], [(got, peer)])
    received = got.clone()                      # the receive must be complete now
    for r in requests:
        r.wait()
    empty = ex.exchange([], [])
    return received, len(requests), empty


def test_send_and_receive_in_one_batch():
    results = ex.run(_both_directions, 2, timeout=60)
    assert_close_per_rank([received for received, _, _ in results],
                          [torch.full((3, 4), float(2 - rank)) for rank in range(2)],
                          "the buffer each rank received from the other")
    for rank, (_, n, empty) in enumerate(results):
        assert n == 1, (f"rank {rank}: return the requests of the sends (one per send): "
                        f"expected 1, got {n}")
        assert empty == [], f"rank {rank}: nothing to do should return [], got {empty!r}"


def _chain():
    """Three stages: the middle one receives from both sides and sends to both."""
    rank = dist.get_rank()
    left, right = torch.zeros(2), torch.zeros(2)
    sends, recvs = [], []
    if rank > 0:
        sends.append((torch.full((2,), 10.0 + rank), rank - 1))
        recvs.append((left, rank - 1))
    if rank < 2:
        sends.append((torch.full((2,), 20.0 + rank), rank + 1))
        recvs.append((right, rank + 1))
    for r in ex.exchange(sends, recvs):
        r.wait()
    return left, right


def test_middle_stage_talks_to_both_neighbours():
    results = ex.run(_chain, 3, timeout=60)
    # rank r's left buffer holds what rank r-1 sent right (20 + r-1), its right buffer what
    # rank r+1 sent left (10 + r+1); an end of the chain receives nothing on its open side
    assert_close_per_rank([left for left, _ in results],
                          [torch.zeros(2), torch.full((2,), 20.0), torch.full((2,), 21.0)],
                          "the buffer received from the left neighbour")
    assert_close_per_rank([right for _, right in results],
                          [torch.full((2,), 11.0), torch.full((2,), 12.0), torch.zeros(2)],
                          "the buffer received from the right neighbour")


def _train_with_student_exchange(schedules):
    return [ppx.train_stage(s, CFG, 8, 1, exchange=ex.exchange) for s in schedules]


@pytest.mark.parametrize("p", [2])
def test_pipeline_training_equals_one_process(p):
    model = GPT(CFG, 0)
    x, y = MarkovText(CFG.vocab_size, CFG.seq_len).batch(0, 8)
    loss = lm_loss(model(x), y)
    loss.backward()
    schedules = [pp.make_schedule("1f1b", p, 4), pp.make_schedule("interleaved-1f1b", p, 4, 2)]
    per_rank = ex.run(_train_with_student_exchange, p, schedules, timeout=120)
    for i, s in enumerate(schedules):
        run = ppx.merge(s, [r[i] for r in per_rank])
        assert run.losses[0] == pytest.approx(loss.item(), rel=1e-5), s.name
        for name, param in model.named_parameters():
            torch.testing.assert_close(run.grads[name], param.grad, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, s=s, name=name: f"{s.name}: {name}: {m}")
