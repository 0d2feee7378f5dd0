"""The flags a step carries (its loss, a preemption notice, out of memory): read a step late where no
decision waits on them, never lost before a save, and carried under DDP as the gradient of a
parameter of their own, which the loop's in-place average of DDP's buckets reduces with the rest."""

from __future__ import annotations

import math

import torch
from torch import nn

from tasks.core.training.torch_step import FLUSH_STEPS, StepSums, Totals
from tasks.core.training.votes import FLAGS, LOSS, STOP, StepVotes, VoteCarrier, bucket_views


class Notice:
    received = False


def pend_step(votes: StepVotes, step: int, loss: float):
    return votes.pend(0, step, torch.tensor(loss))


def carried_votes(notice=None) -> tuple[VoteCarrier, StepVotes]:
    carrier = VoteCarrier(nn.Linear(2, 1))
    carrier.flags.grad = torch.zeros(len(FLAGS))
    return carrier, StepVotes(notice, carrier.flags)


def test_a_loss_that_is_not_finite_is_found_one_step_later_with_where_it_came_from():
    votes = StepVotes()
    assert pend_step(votes, 0, 1.0) is None
    assert pend_step(votes, 1, math.nan) is None  # pending: nothing waits on this step's flags
    found = pend_step(votes, 2, 1.0)
    assert (found.epoch, found.step) == (0, 1) and math.isnan(found.loss)


def test_settle_reads_what_is_pending_before_a_save():
    votes = StepVotes()
    pend_step(votes, 0, math.inf)
    found = votes.settle()
    assert (found.step, found.loss) == (0, math.inf)
    assert votes.settle() is None  # read once


def test_alone_a_preemption_notice_is_agreed_when_the_step_it_came_in_is_read():
    notice = Notice()
    votes = StepVotes(notice)
    pend_step(votes, 0, 1.0)
    assert not votes.stop_agreed
    notice.received = True
    pend_step(votes, 1, 1.0)
    assert votes.stop_agreed


def test_the_flags_are_a_root_of_the_synced_backward_and_arrive_in_their_gradient():
    notice = Notice()
    carrier, votes = carried_votes(notice)
    carrier.module.weight.grad = torch.zeros_like(carrier.module.weight)
    loss = carrier(torch.ones(1, 2)).sum()
    notice.received = True
    torch.autograd.backward(*votes.roots(loss, torch.tensor(2.5)))
    assert carrier.flags.grad.tolist() == [2.5, 1.0, 0.0]  # loss, notice, out of memory
    assert carrier.module.weight.grad.tolist() == [[1.0, 1.0]]  # the model's gradient as without them
    assert votes.synced(0, 3, torch.tensor(2.5)) is None  # pending, the gradient zeroed for the next step
    assert carrier.flags.grad.tolist() == [0.0, 0.0, 0.0]
    assert not votes.stop_agreed
    votes.settle()
    assert votes.stop_agreed


def test_a_divergence_on_another_rank_is_found_without_this_ranks_loss():
    carrier, votes = carried_votes()
    carrier.flags.grad[LOSS] = math.nan  # the average over the ranks
    votes.synced(1, 4, torch.tensor(0.5))
    found = votes.settle()
    assert (found.epoch, found.step, found.loss) == (1, 4, None)


def test_the_guarded_decision_reads_its_own_step_and_what_was_pending_first():
    carrier, votes = carried_votes()
    votes.ride(torch.tensor(0.5), out_of_memory=True)
    assert carrier.flags.grad.tolist() == [0.5, 0.0, 1.0]
    assert votes.decide_now(0, 5, torch.tensor(0.5)) == (True, None)
    assert carrier.flags.grad.tolist() == [0.0, 0.0, 0.0]
    carrier.flags.grad[LOSS] = math.nan
    votes.synced(0, 6, torch.tensor(math.nan))
    votes.ride(None, out_of_memory=True)  # out of memory before any micro-batch's loss
    out_of_memory, found = votes.decide_now(0, 7, None)
    assert found.step == 6 and not out_of_memory  # the divergence decides alone


def test_a_loss_that_is_not_finite_leaves_the_other_flags_alone():
    carrier, votes = carried_votes()
    votes.ride(torch.tensor(math.inf), out_of_memory=False)
    assert carrier.flags.grad.tolist() == [math.inf, 0.0, 0.0]
    out_of_memory, found = votes.decide_now(0, 2, torch.tensor(math.inf))
    assert not out_of_memory and not votes.stop_agreed and found.loss == math.inf


def test_a_notice_rides_on_the_guarded_path_too():
    notice = Notice()
    carrier, votes = carried_votes(notice)
    notice.received = True
    votes.ride(torch.tensor(1.0), out_of_memory=False)
    assert carrier.flags.grad[STOP] == 1
    assert votes.decide_now(0, 0, torch.tensor(1.0)) == (False, None) and votes.stop_agreed


def test_the_flags_land_in_the_bucket_ddp_reduces_first():
    carrier = VoteCarrier(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))
    assert list(carrier.parameters())[-1] is carrier.flags  # DDP's first bucket holds the last ones
    assert carrier.flags.dtype == carrier.module[1].weight.dtype


def test_gradients_that_tile_a_storage_are_reduced_where_they_lie():
    bucket = torch.zeros(10)
    tiled = [bucket[:6].view(2, 3), bucket[6:]]
    alone, strided = torch.zeros(3), torch.zeros(8)[::2]
    gapped = torch.zeros(10)
    flats, loose = bucket_views([*tiled, alone, strided, gapped[:4], gapped[5:]])
    assert [flat.data_ptr() for flat in flats] == [bucket.data_ptr(), alone.data_ptr()]
    assert [flat.numel() for flat in flats] == [10, 3]
    assert len(loose) == 3  # not contiguous, or a gap in the storage


def test_a_step_adds_to_the_totals_only_once_it_has_run():
    totals, sums = Totals(torch.device("cpu")), StepSums()
    logits, y = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]]), torch.tensor([0, 1, 1])
    sums.add(torch.tensor(0.25), logits[:2], y[:2])
    sums.add(torch.tensor(0.5), logits[2:], y[2:])
    assert totals.read() == (0.0, 0)  # nothing until the step has run
    totals.add_step(sums, rows=3)
    assert totals.read() == (2.25, 2)


def test_the_totals_count_waiting_answers_in_a_few_kernels_and_when_read():
    totals, y = Totals(torch.device("cpu")), torch.tensor([0, 1])
    logits = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # one right answer a step
    for step in range(FLUSH_STEPS + 1):
        sums = StepSums()
        sums.add(torch.tensor(0.5), logits, y)
        totals.add_step(sums, rows=2 if step else 4)
    assert len(totals.hits) == 1  # FLUSH_STEPS were counted, one waits
    assert totals.read() == (0.5 * 4 + 0.5 * 2 * FLUSH_STEPS, FLUSH_STEPS + 1)
    assert totals.hits == []
