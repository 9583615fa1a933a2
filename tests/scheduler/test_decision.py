"""Decisions' reason codes: left out of equality, and a resize's worked out from its shapes."""

from __future__ import annotations

from builders import make_plan

from scheduler.cluster import Allocation
from scheduler.decision import ReasonCode, reject, resize_code, start, stop


def _alloc(gpu_type: str, n: int) -> Allocation:
    return Allocation("j", make_plan(gpu_type, n), (("n0", n),))


def test_the_code_is_left_out_of_equality() -> None:
    a = _alloc("A100-40G", 2)
    assert start(a, "why", ReasonCode.PLACE) == start(a, "why")
    assert hash(stop("j", "why", ReasonCode.PAUSE)) == hash(stop("j", "why"))
    assert start(a, "why", ReasonCode.PLACE) != start(a, "other", ReasonCode.PLACE)
    assert reject("j", "why").code is ReasonCode.REJECT


def test_resize_code_from_the_shapes() -> None:
    two, four = _alloc("A100-40G", 2), _alloc("A100-40G", 4)
    assert resize_code(two, four) is ReasonCode.GROW
    assert resize_code(four, two) is ReasonCode.SHRINK
    assert resize_code(two, _alloc("RTX2080Ti", 4)) is ReasonCode.MOVE  # another type
    assert resize_code(two, _alloc("A100-40G", 2)) is ReasonCode.MOVE  # as many, re-planned
