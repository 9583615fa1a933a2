"""The real-GPU out-of-memory check's set-up (benchmarks.trainer_cuda_oom; the run itself
needs CUDA): the plans the under-predicting model offers put one first that the true model
says cannot fit, and keep one that can."""

from __future__ import annotations

import pytest
import torch

from benchmarks.trainer_cuda_oom import GIB, _plans, main


def test_the_first_plan_cannot_fit_and_a_later_one_can() -> None:
    cap, under = 10 * GIB, 0.4
    plans = _plans(cap, under)
    assert len(plans) >= 2
    # every plan seems to fit the GPU (its context included) under the scaled model
    assert all(p.required_bytes <= cap + (1 << 30) for p in plans)
    true = [p.memory.tensors / (1 - under) for p in plans]
    assert true[0] > cap  # the best one runs out of memory for real
    assert min(true[1:]) < 0.8 * cap  # and a slower one has room
    steps = [p.step_time_s for p in plans]
    assert steps == sorted(steps)  # fastest first, as the policy would try them


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_cuda_it_says_so_and_exits_2() -> None:
    assert main([]) == 2
