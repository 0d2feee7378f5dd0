"""The flags a step carries (out of memory, loss not finite, preemption notice): read a step late
where no decision waits on them, and never lost before a save."""

from __future__ import annotations

import math

import torch

from tasks.core.training.votes import OUT_OF_MEMORY, StepVotes


class Notice:
    received = False


def pend_step(votes: StepVotes, step: int, loss: float, out_of_memory: bool = False):
    flagged, flags = votes.flags(0, step, torch.tensor(loss * 4, dtype=torch.float64), 4, out_of_memory)
    return votes.pend(flagged, flags)


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


def test_a_preemption_notice_is_agreed_when_its_flag_is_read():
    notice = Notice()
    votes = StepVotes(notice)
    pend_step(votes, 0, 1.0)
    notice.received = True
    pend_step(votes, 1, 1.0)  # carries the notice
    assert not votes.stop_agreed
    pend_step(votes, 2, 1.0)
    assert votes.stop_agreed


def test_the_guarded_decision_reads_its_own_step_and_what_was_pending_first():
    votes = StepVotes()
    flagged, flags = votes.flags(0, 5, torch.tensor(2.0, dtype=torch.float64), 4, out_of_memory=True)
    assert flags[OUT_OF_MEMORY] == 1
    assert votes.decide_now(flagged, flags * 2) == (True, None)  # summed over two ranks
    pend_step(votes, 6, math.nan)
    flagged, flags = votes.flags(0, 7, torch.tensor(2.0, dtype=torch.float64), 4, out_of_memory=True)
    out_of_memory, found = votes.decide_now(flagged, flags)
    assert found.step == 6 and not out_of_memory  # the divergence decides alone
