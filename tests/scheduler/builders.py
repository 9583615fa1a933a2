"""Small builders for scheduler tests: plans from hand-chosen memory and step times (no planner),
jobs, nodes, clusters, and a checker that applies decisions the way the controller does."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from predictor.gpus import get_gpu
from predictor.memory import MemoryBreakdown
from predictor.plan import Plan
from predictor.spec import ParallelConfig, Precision
from predictor.step_time import StepTime
from scheduler.cluster import Allocation, ClusterState, Node, Placement
from scheduler.decision import Decision, DecisionKind, ReasonCode
from scheduler.job import JobView, RunningJob

GIB = 1 << 30


def make_plan(
    gpu_type: str,
    num_gpus: int,
    *,
    step_s: float = 1.0,
    req_gib: float = 8.0,
    tp: int = 1,
    pp: int = 1,
    num_steps: int = 100,
    rank: int = 0,
) -> Plan:
    """A plan of ``num_gpus`` GPUs (``tp``·``pp``·dp) needing ``req_gib`` per GPU."""
    dp = num_gpus // (tp * pp)
    assert dp * tp * pp == num_gpus, "num_gpus must be a multiple of tp*pp"
    req = int(req_gib * GIB)
    mem = MemoryBreakdown(parameters=req // 2, gradients=req // 4, optimizer_states=0,
                          activations=req - req // 2 - req // 4, logits=0, overhead=0)
    step = StepTime(compute_s=step_s, tp_comm_s=0.0, pp_bubble_s=0.0, pp_p2p_s=0.0,
                    dp_comm_s=0.0, optimizer_s=0.0, total_s=step_s)
    return Plan(gpu_type=gpu_type, parallel=ParallelConfig(tp=tp, pp=pp, dp=dp),
                precision=Precision.FP16, memory=mem, step=step, num_steps=num_steps,
                required_bytes=req, rank=rank)


def ranked(*plans: Plan) -> tuple[Plan, ...]:
    """Number plans 1..n in the given order (the order is the ranking)."""
    from dataclasses import replace

    return tuple(replace(p, rank=i) for i, p in enumerate(plans, start=1))


def make_job(
    job_id: str,
    plans: Iterable[Plan],
    *,
    submit: float = 0.0,
    requested: int | None = None,
    total_steps: int = 100,
    restarts: int = 0,
) -> JobView:
    return JobView(id=job_id, submit_time=submit, plans=tuple(plans), total_steps=total_steps,
                   requested_gpus=requested, restarts=restarts)


def make_node(
    node_id: str,
    gpu_type: str,
    total: int,
    free: int | None = None,
    *,
    memory_gib: float | None = None,
    interconnect: str = "pcie",
) -> Node:
    mem = int(memory_gib * GIB) if memory_gib is not None else get_gpu(gpu_type).memory_bytes
    return Node(id=node_id, gpu_type=gpu_type, gpu_memory=mem, total_gpus=total,
                free_gpus=total if free is None else free, interconnect=interconnect)


def cluster(*nodes: Node, inter_bw_gbs: float = 12.5) -> ClusterState:
    return ClusterState(nodes=tuple(nodes), inter_node_bw_gbs=inter_bw_gbs)


def phoebe() -> ClusterState:
    """Sia's phoebe cluster: 3×8 RTX 2080Ti, 2×8 A100-40G (NVLink), 1×4 Quadro RTX 6000."""
    nodes = [make_node(f"rtx-{i}", "RTX2080Ti", 8) for i in range(3)]
    nodes += [make_node(f"dgx-{i}", "A100-40G", 8, interconnect="nvlink") for i in range(2)]
    nodes.append(make_node("quad-0", "RTX6000", 4))
    return cluster(*nodes)


class IdentityPerf:
    """A PerfModel stub that keeps the plan's step time and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Placement]] = []

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        self.calls.append((job.id, placement))
        return plan


class NodesPenaltyPerf:
    """A PerfModel stub: each extra node a plan spans adds 50% to its step time."""

    def placed_plan(self, job: JobView, plan: Plan, placement: Placement,
                    state: ClusterState) -> Plan:
        if len(placement) == 1:
            return plan
        from dataclasses import replace

        slower = plan.step.total_s * (1 + 0.5 * (len(placement) - 1))
        return plan.with_step(replace(plan.step, total_s=slower))


@dataclass
class Applied:
    """The cluster after applying decisions, and who holds what."""

    state: ClusterState
    holding: dict[str, Allocation] = field(default_factory=dict)


def apply_decisions(
    state: ClusterState, running: Sequence[RunningJob], decisions: Sequence[Decision]
) -> Applied:
    """Apply ``decisions`` one at a time in the given order (stricter than the controller,
    which releases every resize before granting any); raises ``CapacityError`` on any GPU
    asked while still held, and ``AssertionError`` on a decision for the wrong kind of job."""
    holding = {r.job.id: r.allocation for r in running}
    seen: set[str] = set()
    for d in decisions:
        if d.kind is DecisionKind.STOP:
            assert d.job_id in holding, f"stop of {d.job_id}, which holds nothing"
            state = state.release(holding.pop(d.job_id))
        elif d.kind is DecisionKind.RESIZE:
            assert d.job_id in holding, f"resize of {d.job_id}, which holds nothing"
            assert d.job_id not in seen, f"two decisions move {d.job_id}"
            state = state.release(holding.pop(d.job_id))
            assert d.allocation is not None
            state = state.allocate(d.allocation)
            holding[d.job_id] = d.allocation
        else:
            assert d.job_id not in holding, f"start of {d.job_id}, which already holds GPUs"
            assert d.allocation is not None
            state = state.allocate(d.allocation)
            holding[d.job_id] = d.allocation
        seen.add(d.job_id)
    return Applied(state, holding)


def assert_allocation_valid(state: ClusterState, alloc: Allocation) -> None:
    """The plan's GPU count is the placement's, and every node has the plan's GPU type and
    enough memory per GPU."""
    assert alloc.plan.num_gpus == alloc.num_gpus, (alloc.plan.num_gpus, alloc.placement)
    by_id = state.by_id
    nodes = [node_id for node_id, _ in alloc.placement]
    assert len(nodes) == len(set(nodes)), f"node listed twice in {alloc.placement}"
    for node_id, n in alloc.placement:
        node = by_id[node_id]
        assert n > 0
        assert node.gpu_type == alloc.plan.gpu_type, (node, alloc.plan.gpu_type)
        assert node.gpu_memory >= alloc.plan.required_bytes, (node, alloc.plan.required_bytes)


def summary(decisions: Sequence[Decision]) -> list[tuple[str, str, Placement | None, str]]:
    """Comparable digest of decisions (kind, job, placement, plan label)."""
    return [(d.kind.value, d.job_id, d.allocation.placement if d.allocation else None,
             d.allocation.plan.label() if d.allocation else "") for d in decisions]


CODES_BY_KIND = {
    DecisionKind.START: {ReasonCode.PLACE, ReasonCode.ADMIT, ReasonCode.FILL},
    DecisionKind.RESIZE: {ReasonCode.GROW, ReasonCode.SHRINK, ReasonCode.MOVE},
    DecisionKind.STOP: {ReasonCode.PREEMPT, ReasonCode.PAUSE, ReasonCode.NO_FIT},
    DecisionKind.REJECT: {ReasonCode.REJECT, ReasonCode.TOO_COSTLY},
}


def assert_reason_codes(decisions: Sequence[Decision], running: Sequence[RunningJob]) -> None:
    """Every decision carries a reason code of its kind; a resize's says what changed against
    the allocation the job held (same type: more GPUs grow, fewer shrink; else a move), and
    so do the stop and the start a resize is split into (``order_for_sequential_apply``)."""
    held = {r.job.id: r.allocation for r in running}
    for d in decisions:
        if "split" in d.reason and d.kind is not DecisionKind.RESIZE:
            # a resize split into stop + start keeps the resize's code
            assert d.code in CODES_BY_KIND[DecisionKind.RESIZE], d
            continue
        assert d.code in CODES_BY_KIND[d.kind], d
        if d.kind is DecisionKind.RESIZE:
            assert d.allocation is not None
            before, after = held[d.job_id], d.allocation
            same_type = before.plan.gpu_type == after.plan.gpu_type
            want = (ReasonCode.MOVE if not same_type or after.num_gpus == before.num_gpus
                    else ReasonCode.GROW if after.num_gpus > before.num_gpus
                    else ReasonCode.SHRINK)
            assert d.code is want, (d, before)
