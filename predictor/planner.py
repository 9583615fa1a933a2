"""Enumerate every valid parallel plan of a job on each GPU type, keep those that fit, rank them.

The search (per GPU type): tp over divisors of the heads that fit in one node, pp over the
divisors of the layer count, dp over the divisors of the global batch, micro-batch over the
divisors of the per-replica batch. Two facts keep it small without losing any plan worth
running:

* memory grows with the micro-batch, so once a micro-batch does not fit, larger ones are
  skipped;
* for a fixed layout and micro-batch, the memory savers (ZeRO stages, recomputation) only
  cost time, so the first saver, in order of increasing time cost, that makes the plan fit
  is the one kept.

Of the fitting plans, the fastest per (GPU type, GPU count) is kept: a scheduler that can
grant n GPUs of a type has no use for a slower plan of the same shape. The survivors are
sorted by a named, swappable ranking (``RANKINGS``), each with the reason for its rank.
"""

from __future__ import annotations

import functools
import logging
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from predictor.errors import SpecError
from predictor.gpus import GIB, GpuType, load_gpu_catalog
from predictor.memory import (
    ActivationTerms,
    MemoryBreakdown,
    StaticTerms,
    activation_peaks,
    activation_terms,
    estimate_memory,
    peak_tensor_curve,
    static_terms,
)
from predictor.plan import Plan
from predictor.spec import ModelSpec, ParallelConfig, Precision, Recompute, TrainingSpec
from predictor.step_time import (
    StepTimeModel,
    default_topology,
    lower_bound_per_micro_batch,
)

log = logging.getLogger(__name__)

DEFAULT_MARGIN = 0.05
"""Fraction of a GPU's memory kept free: allocator fragmentation beyond the modelled
overhead, and the model's own error (worst case ≈ 8% on tensors, far less on the total)."""

DEFAULT_MAX_GPUS = 64
DEFAULT_MAX_PP = 8
"""Deepest pipeline searched by default: with tp <= 8 per node, pp = 8 already spans 64 GPUs,
and deeper pipelines only pay off for models that fit nowhere else (raise it for those)."""
GPUS_PER_NODE = 8

# Memory savers in order of increasing time cost. ZeRO-1 and -2 reshape the gradient
# all-reduce into reduce-scatter + all-gather of the same volume (free in time); ZeRO-3
# adds parameter all-gathers; selective recompute re-runs attention cores; full recompute
# re-runs every layer's forward (+1/3 of the math).
_SAVERS: tuple[tuple[Recompute, int], ...] = (
    (Recompute.NONE, 0),
    (Recompute.NONE, 1),
    (Recompute.NONE, 2),
    (Recompute.SELECTIVE, 0),
    (Recompute.SELECTIVE, 1),
    (Recompute.SELECTIVE, 2),
    (Recompute.NONE, 3),
    (Recompute.SELECTIVE, 3),
    (Recompute.FULL, 0),
    (Recompute.FULL, 1),
    (Recompute.FULL, 2),
    (Recompute.FULL, 3),
)

RankKey = Callable[[Plan], tuple[float, ...]]


def rank_by_gpu_seconds(plan: Plan) -> tuple[float, ...]:
    """Resource efficiency first (GPU-seconds to finish), then job time (DESIGN §3 default)."""
    return (plan.gpu_seconds, plan.job_time_s, plan.num_gpus)


def rank_by_job_time(plan: Plan) -> tuple[float, ...]:
    """Fastest finish first, then fewer GPU-seconds."""
    return (plan.job_time_s, plan.gpu_seconds, plan.num_gpus)


def rank_by_fewest_gpus(plan: Plan) -> tuple[float, ...]:
    """Smallest footprint first (Frenzy's 'minimum cards'), then job time."""
    return (plan.num_gpus, plan.job_time_s)


RANKINGS: dict[str, RankKey] = {
    "gpu_seconds": rank_by_gpu_seconds,
    "job_time": rank_by_job_time,
    "fewest_gpus": rank_by_fewest_gpus,
}


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The ranked plans of a job; when none fits, ``infeasible`` says what the smallest
    per-GPU need is and which GPU types were considered."""

    model: ModelSpec
    train: TrainingSpec
    plans: tuple[Plan, ...]
    infeasible: str | None = None
    min_required_bytes: int | None = None
    considered: int = 0

    @property
    def best(self) -> Plan:
        if not self.plans:
            raise SpecError("model", self.infeasible or "no plan fits")
        return self.plans[0]


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of ``n`` in ascending order, at most ``limit``."""
    return list(_divisors(n, limit))


@functools.lru_cache(maxsize=4096)
def _divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    """``divisors`` as a cached tuple (the search asks for the same few many times)."""
    top = n if limit is None else min(n, limit)
    return tuple(d for d in range(1, top + 1) if n % d == 0)


def _tp_options(model: ModelSpec, train: TrainingSpec, per_node: int) -> list[int]:
    out = []
    for t in divisors(model.num_heads, per_node):
        if model.ffn_hidden_size % t:
            continue
        if model.num_kv_heads % t and t % model.num_kv_heads:
            continue
        if train.sequence_parallel and t > 1 and train.seq_len % t:
            continue
        out.append(t)
    return out


def _precision_for(gpu: GpuType, precision: Precision) -> tuple[Precision, tuple[str, ...]]:
    if gpu.supports(precision):
        return precision, ()
    return Precision.FP16, (f"{gpu.name} has no bf16 tensor cores: planned in fp16 mixed",)


class _MemoryTable:
    """Tensor memory of each configuration, computed once per job and shared by all GPU
    types: only the runtime overhead differs between GPUs (a bf16 plan re-planned in fp16 on
    a GPU without bf16 has the same bytes), so it is added per GPU at lookup.

    The search only compares peaks with budgets, so it asks ``curve``: the exact integer form
    of ``estimate_memory(...).tensors`` at every micro-batch of a layout, from a static part
    (per tp, pp, ZeRO stage, and dp under ZeRO) and an activation part (per tp, pp,
    recomputation; dp only through the micro-batches in flight), each computed once. The
    full breakdown (``get``) is built only for the plans the planner keeps.
    """

    def __init__(self, model: ModelSpec, train: TrainingSpec) -> None:
        self.model, self.train = model, train
        self.activation: dict[tuple[int, ...], ActivationTerms] = {}
        self.peaks: dict[tuple[int, ...], tuple[list[int], ...]] = {}
        self.static: dict[tuple[int, ...], StaticTerms] = {}
        self.curves: dict[tuple[int, ...], list[int]] = {}
        self.table: dict[tuple[int, ...], MemoryBreakdown] = {}
        self.floor = 1 << 62  # smallest tensor memory seen (for the infeasible answer)

    def curve(self, tp: int, pp: int, dp: int, recompute: Recompute, zero: int
              ) -> list[int]:
        """Tensor bytes of the worst stage (``estimate_memory(...).tensors``) at each
        micro-batch of the layout (the ascending divisors of the per-replica batch); they
        never decrease with the micro-batch."""
        key = (tp, pp, dp, _RC_INDEX[recompute], zero)
        out = self.curves.get(key)
        if out is None:
            pkey = key[:4]
            peaks = self.peaks.get(pkey)
            if peaks is None:
                akey = (tp, pp, key[3])
                act = self.activation.get(akey)
                if act is None:
                    act = self.activation[akey] = activation_terms(
                        self.model, self.train, tp, pp, recompute,
                        self.train.sequence_parallel and tp > 1, self.train.flash_attention)
                per_replica = self.train.global_batch // dp
                peaks = self.peaks[pkey] = activation_peaks(act, per_replica,
                                                            _divisors(per_replica))
            skey = (tp, pp, dp if zero else 0, zero)
            static = self.static.get(skey)
            if static is None:
                static = self.static[skey] = static_terms(self.model, self.train, tp, pp, dp,
                                                          zero)
            out = self.curves[key] = peak_tensor_curve(static, peaks)
            if out[0] < self.floor:
                self.floor = out[0]
        return out

    def get(self, tp: int, pp: int, dp: int, mb: int, recompute: Recompute, zero: int
            ) -> MemoryBreakdown:
        """The full breakdown of a configuration (memoised)."""
        key = (tp, pp, dp, mb, _RC_INDEX[recompute], zero)
        mem = self.table.get(key)
        if mem is None:
            mem = self.table[key] = estimate_memory(
                self.model, self.train, self.par(tp, pp, dp, mb, recompute, zero), None)
        return mem

    def par(self, tp: int, pp: int, dp: int, mb: int, recompute: Recompute, zero: int
             ) -> ParallelConfig:
        """The ``ParallelConfig`` of a search point, with the job's SP and flash flags."""
        return ParallelConfig.trusted(
            tp, pp, dp, mb, recompute, zero, self.train.sequence_parallel,
            self.train.flash_attention)


_RC_INDEX = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}


Config = tuple[int, int, int, int, Recompute, int]  # tp, pp, dp, micro-batch, recompute, zero


def _best_for_layout(
    table: _MemoryTable, budget: float, tp: int, pp: int, dp: int
) -> list[Config]:
    """Fitting configurations of one (tp, pp, dp) layout within ``budget`` tensor bytes: per
    micro-batch, the cheapest memory saver that fits.

    Memory grows with the micro-batch under any saver, so each saver fits a prefix of the
    (sorted) micro-batches, found by bisecting the saver's memory curve; a saver only adds
    the micro-batches that no cheaper saver fits. Without pipelining (pp = 1) a larger
    micro-batch with the same saver does the same work in fewer, larger GEMMs, so only the
    largest one of each saver is kept; with pp > 1 smaller micro-batches shrink the 1F1B
    bubble, so all are.
    """
    mbs = _divisors(table.train.global_batch // dp)
    last = len(mbs) - 1
    if table.curve(tp, pp, dp, Recompute.FULL, 3 if dp > 1 else 0)[0] > budget:
        return []  # not even the most frugal saver fits one sequence
    out: list[Config] = []
    covered = 0  # micro-batches [0, covered) fit a cheaper saver
    for recompute, zero in _SAVERS:
        if zero and dp == 1:
            continue
        j = bisect_right(table.curve(tp, pp, dp, recompute, zero), budget) - 1
        if j < covered:
            continue  # fits nothing that a cheaper saver does not
        picks = (j,) if pp == 1 else range(covered, j + 1)
        out.extend((tp, pp, dp, mbs[x], recompute, zero) for x in picks)
        covered = j + 1
        if covered > last:
            break
    return out


def plan_job(
    model: ModelSpec,
    train: TrainingSpec,
    gpus: Sequence[GpuType] | None = None,
    *,
    max_gpus: int = DEFAULT_MAX_GPUS,
    max_pp: int = DEFAULT_MAX_PP,
    gpus_per_node: int = GPUS_PER_NODE,
    margin: float = DEFAULT_MARGIN,
    ranking: str | RankKey = "gpu_seconds",
    keep_all: bool = False,
) -> PlanResult:
    """All plans of ``model`` trained as ``train`` on each GPU type of ``gpus`` (default:
    the whole catalog), ranked; ``keep_all`` keeps every fitting plan, not only the fastest
    per (GPU type, count)."""
    train.check_against(model)
    if not 0 <= margin < 1:
        raise SpecError("margin", f"must be in [0, 1), got {margin}")
    if max_gpus < 1:
        raise SpecError("max_gpus", f"must be >= 1, got {max_gpus}")
    rank_key = RANKINGS.get(ranking) if isinstance(ranking, str) else ranking
    if rank_key is None:
        raise SpecError("ranking", f"unknown ranking {ranking!r}; one of {', '.join(RANKINGS)}")
    gpu_list = list(gpus) if gpus is not None else list(load_gpu_catalog().values())
    if not gpu_list:
        raise SpecError("gpus", "no GPU types to plan for")

    best: dict[tuple[str, int], Plan] = {}
    every: list[Plan] = []
    table = _MemoryTable(model, train)
    layouts: dict[tuple[float, int, int, int], list[Config]] = {}  # GPUs of equal budget share
    considered = 0
    steps = train.num_steps
    for gpu in gpu_list:
        precision, notes = _precision_for(gpu, train.precision)
        gtrain = train if precision is train.precision else replace(train, precision=precision)
        # every fitting configuration of this GPU type, by GPU count, with a compute-only
        # lower bound of its step time
        by_count: dict[int, list[tuple[float, Config]]] = {}
        flash, sp_knob = train.flash_attention, train.sequence_parallel
        budget = gpu.memory_bytes * (1.0 - margin) - gpu.runtime_overhead_bytes
        per_micro: dict[tuple[int, int, int, Recompute], float] = {}
        for tp in _tp_options(model, train, min(gpus_per_node, max_gpus)):
            for pp in _divisors(model.num_layers, min(max_pp, max_gpus // tp)):
                for dp in _divisors(train.global_batch, max_gpus // (tp * pp)):
                    lkey = (budget, tp, pp, dp)
                    cfgs = layouts.get(lkey)
                    if cfgs is None:
                        cfgs = layouts[lkey] = _best_for_layout(table, budget, tp, pp, dp)
                    if not cfgs:
                        continue
                    bucket = by_count.setdefault(tp * pp * dp, [])
                    per_replica = train.global_batch // dp
                    for cfg in cfgs:
                        # compute_lower_bound, its dp-free part computed once
                        mb, recompute = cfg[3], cfg[4]
                        pkey = (tp, pp, mb, recompute)
                        pm = per_micro.get(pkey)
                        if pm is None:
                            pm = per_micro[pkey] = lower_bound_per_micro_batch(
                                model, gtrain, gpu, tp=tp, pp=pp, micro_batch=mb,
                                recompute=recompute, flash=flash, sequence_parallel=sp_knob)
                        bucket.append(((max(1, per_replica // mb) + pp - 1) * pm, cfg))
        for n, cands in by_count.items():
            step_model = StepTimeModel(model, gtrain, gpu,
                                       default_topology(gpu, n, gpus_per_node))
            cands.sort(key=lambda c: c[0])
            k = (gpu.name, n)
            for lb, cfg in cands:
                if not keep_all and k in best and lb >= best[k].step_time_s:
                    break  # sorted by bound: nothing after this can be faster
                considered += 1
                par = table.par(*cfg)
                step = step_model.estimate(par)
                if not keep_all and k in best and step.total_s >= best[k].step_time_s:
                    continue
                mem = table.get(*cfg)
                plan = Plan(
                    gpu_type=gpu.name, parallel=par, precision=precision,
                    memory=replace(mem, overhead=gpu.runtime_overhead_bytes),
                    step=step, num_steps=steps, notes=notes,
                    required_bytes=int((mem.tensors + gpu.runtime_overhead_bytes)
                                       / (1.0 - margin)),
                )
                if keep_all:
                    every.append(plan)
                if k not in best or plan.step_time_s < best[k].step_time_s:
                    best[k] = plan

    candidates = every if keep_all else list(best.values())
    if not candidates:
        largest = max(gpu_list, key=lambda g: g.memory_bytes)
        overhead = min(g.runtime_overhead_bytes for g in gpu_list)
        need = (table.floor + overhead) / (1.0 - margin)
        return PlanResult(
            model=model, train=train, plans=(), considered=considered, min_required_bytes=int(need),
            infeasible=(
                f"{model.name} needs at least {need / GIB:.1f} GiB per GPU even with the most "
                f"memory-saving plan within {max_gpus} GPUs (tp<={gpus_per_node}, ZeRO-3, full "
                f"recomputation); the largest GPU considered, {largest.name}, has "
                f"{largest.memory_gib:.1f} GiB. Use more GPUs (max_gpus), a shorter sequence "
                "or a smaller global batch."
            ),
        )
    ordered = sorted(candidates, key=rank_key)
    return PlanResult(
        model=model, train=train, plans=tuple(_with_reasons(ordered, ranking)),
        considered=considered,
    )


def _with_reasons(ordered: list[Plan], ranking: str | RankKey) -> list[Plan]:
    name = ranking if isinstance(ranking, str) else getattr(ranking, "__name__", "custom")
    top = ordered[0]
    out = []
    for i, plan in enumerate(ordered, start=1):
        if i == 1:
            why = (
                f"#1 by {name}: {plan.gpu_seconds / 3600:.2f} GPU-h, "
                f"job {plan.job_time_s / 3600:.2f} h"
            )
        else:
            gs = plan.gpu_seconds / top.gpu_seconds - 1.0
            speed = top.job_time_s / plan.job_time_s
            why = (
                f"#{i} by {name}: {gs:+.0%} GPU-seconds vs #1, "
                f"{speed:.2f}x #1's speed"
            )
        peak = plan.peak_memory_bytes / GIB
        why += f"; peak {peak:.1f} GiB per GPU"
        out.append(replace(plan, rank=i, reason=why))
    return out
