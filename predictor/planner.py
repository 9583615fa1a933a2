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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import mul

import numpy as np

from predictor.errors import SpecError
from predictor.gpus import GIB, GpuType, load_gpu_catalog
from predictor.memory import (
    GRAD_KINDS,
    NO_MOMENT,
    ActivationRows,
    MemoryBreakdown,
    StaticTerms,
    activation_rows,
    activation_terms,
    estimate_memory,
    static_terms,
)
from predictor.overhead import FIT_MARGIN, NON_TENSOR, NonTensorModel
from predictor.plan import Plan, scale_counted
from predictor.runtimes import DEFAULT_RUNTIME, RuntimeProfile, get_runtime
from predictor.spec import ModelSpec, ParallelConfig, Precision, Recompute, TrainingSpec
from predictor.step_calibration import RUNTIME_STEP_PROFILES
from predictor.step_time import (
    ComputeBound,
    StepTimeModel,
    default_topology,
    device_rates,
)

log = logging.getLogger(__name__)

DEFAULT_MARGIN = FIT_MARGIN
"""Fraction of a GPU's memory kept free beyond the predicted device figure (tensors +
allocator slack + CUDA context + NCCL): the model's held-out error on real GPUs
(``predictor.overhead.FIT_MARGIN``, derived in docs/memory_accuracy.md)."""

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

_SAVERS_NO_ZERO = tuple(sv for sv in _SAVERS if sv[1] == 0)  # ZeRO needs dp > 1
_FRUGAL = {zero: _SAVERS.index((Recompute.FULL, zero)) for zero in range(4)}
"""The ``_SAVERS`` index of the most memory-saving saver when ZeRO goes up to a stage."""

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
    notes: tuple[str, ...] = ()  # about the search itself (what the runtime excluded)

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

    The search only compares peaks with budgets (``_memory_values``), through the exact
    integer form of ``estimate_memory(...).tensors``: a static part (``static_of``: per tp,
    pp, ZeRO stage, and dp under ZeRO) and an activation part (``rows``: per tp, pp,
    recomputation; dp only through the micro-batches in flight), each computed once. The
    full breakdown (``get``) is built only for the plans the planner keeps.
    """

    def __init__(self, model: ModelSpec, train: TrainingSpec,
                 runtime: RuntimeProfile | None = None) -> None:
        self.model, self.train = model, train
        self.runtime = runtime or get_runtime(DEFAULT_RUNTIME)
        self.activation: dict[tuple[int, ...], ActivationRows] = {}
        self.static: dict[tuple[int, ...], StaticTerms] = {}
        self.table: dict[tuple[int, ...], MemoryBreakdown] = {}
        self.floor = 1 << 62  # least memory of any layout's most frugal saver

    def rows(self, tp: int, pp: int, recompute: Recompute, gathers: bool = False
             ) -> ActivationRows:
        """The activation rows of (tp, pp, recomputation) at every micro-batch size of any
        dp (the global batch's divisors), computed once; ``gathers``: of a ZeRO-3 plan at
        dp > 1 (``activation_terms``; the same rows unless the runtime gathers layers)."""
        gathers = gathers and self.runtime.fp32_weights_autocast
        akey = (tp, pp, _RC_INDEX[recompute], gathers)
        rows = self.activation.get(akey)
        if rows is None:
            rows = self.activation[akey] = activation_rows(
                activation_terms(self.model, self.train, tp, pp, recompute,
                                 self.train.sequence_parallel and tp > 1,
                                 self.train.flash_attention, self.runtime, gathers),
                _divisors(self.train.global_batch))
        return rows

    def static_of(self, tp: int, pp: int, dp: int, zero: int) -> StaticTerms:
        """The static bytes (parameters, gradients, optimizer states) per candidate stage;
        dp matters under ZeRO, and otherwise only whether it is above 1."""
        # without ZeRO only "dp > 1" matters (DDP buckets, the flat all-reduce)
        skey = (tp, pp, dp if zero else min(dp, 2), zero)
        static = self.static.get(skey)
        if static is None:
            static = self.static[skey] = static_terms(self.model, self.train, tp, pp, dp, zero,
                                                      self.runtime)
        return static

    def get(self, tp: int, pp: int, dp: int, mb: int, recompute: Recompute, zero: int
            ) -> MemoryBreakdown:
        """The full breakdown of a configuration (memoised)."""
        key = (tp, pp, dp, mb, _RC_INDEX[recompute], zero)
        mem = self.table.get(key)
        if mem is None:
            mem = self.table[key] = estimate_memory(
                self.model, self.train, self.par(tp, pp, dp, mb, recompute, zero), None,
                runtime=self.runtime)
        return mem

    def par(self, tp: int, pp: int, dp: int, mb: int, recompute: Recompute, zero: int
             ) -> ParallelConfig:
        """The ``ParallelConfig`` of a search point, with the job's SP and flash flags."""
        return ParallelConfig.trusted(
            tp, pp, dp, mb, recompute, zero, self.train.sequence_parallel,
            self.train.flash_attention)


_RC_INDEX = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}


Config = tuple[int, int, int, int, Recompute, int]  # tp, pp, dp, micro-batch, recompute, zero


BoundKey = tuple[int, int, int, Recompute]  # tp, pp, micro-batch, recompute


_Group = tuple[int, list[int], list[BoundKey], list[Config]]
"""The fitting configurations of one GPU count: ``m + pp - 1`` of each (the lower bound's
multiplier), the key of its lower bound's dp-free part, the configurations."""


class _Layout:
    """One (tp, pp, dp) layout: its memory savers (in order of time cost) and micro-batches,
    each saver's configurations (built on first use), per micro-batch ``m + pp - 1`` (the
    lower bound's multiplier) and, per recomputation mode, the key of the lower bound's
    dp-free part."""

    __slots__ = ("cfgs", "dp", "fills", "keys", "mbs", "per_replica", "pp", "savers", "table",
                 "tp")

    def __init__(self, table: _MemoryTable, tp: int, pp: int, dp: int) -> None:
        self.table, self.tp, self.pp, self.dp = table, tp, pp, dp
        self.savers = _SAVERS if dp > 1 else _SAVERS_NO_ZERO
        self.cfgs: list[list[Config] | None] = [None] * len(self.savers)
        per_replica = self.per_replica = table.train.global_batch // dp
        mbs = self.mbs = _divisors(per_replica)
        self.fills = [max(1, per_replica // mb) + pp - 1 for mb in mbs]
        self.keys = {rc: [(tp, pp, mb, rc) for mb in mbs] for rc in Recompute}

    def saver_cfgs(self, i: int) -> list[Config]:
        out = self.cfgs[i]
        if out is None:
            recompute, zero = self.savers[i]
            tp, pp, dp = self.tp, self.pp, self.dp
            out = self.cfgs[i] = [(tp, pp, dp, mb, recompute, zero) for mb in self.mbs]
        return out


_RC_OF_SAVER = np.array([_RC_INDEX[rc] + (len(_RC_INDEX) if zero == 3 else 0)
                         for rc, zero in _SAVERS])
"""Each saver's activation rows: by recomputation mode, ZeRO-3's (``_MemoryTable.rows``'s
``gathers``) after the others."""
_ZERO_OF_SAVER = np.array([zero for _, zero in _SAVERS])
_NO_ZERO_POS = {i: pos for pos, i in enumerate(
    i for i, (_, zero) in enumerate(_SAVERS) if zero == 0)}  # _SAVERS index -> dp = 1 index
_NEVER = 1 << 60  # memory of a missing micro-batch, stage or saver: fits no budget


def _memory_values(table: _MemoryTable, layouts: list[_Layout]) -> np.ndarray:
    """``estimate_memory(...).tensors`` of every (layout, saver of ``_SAVERS``, micro-batch
    index), exact integers: per candidate stage the static bytes plus the larger of the
    activation peak (``peaks_in_flight``) and Adam's temporary, the worst stage (as
    ``peak_tensor_curve``). Savers a layout cannot use (ZeRO at dp = 1, a ZeRO stage the
    runtime does not execute) and micro-batch indices past a layout's last are ``_NEVER``."""
    runnable = table.runtime.zero_stages
    sizes = _divisors(table.train.global_batch)  # every micro-batch size of any dp
    column = {b: d for d, b in enumerate(sizes)}
    pad = len(sizes)  # the column of a missing micro-batch: no bytes per micro-batch, _NEVER
    width = max(len(layout.mbs) for layout in layouts)
    pairs: dict[tuple[int, int], int] = {}
    per_mb, rest, later, emb, depths = [], [], [], [], []  # per (tp, pp): [size][rc][stage]
    # a step of one micro-batch, by moment kind (GRAD_KINDS), and the gradients kinds 1..
    # add (StaticTerms' single-step figures)
    alone: list[list] = [[] for _ in range(GRAD_KINDS)]
    ends: list[list] = [[] for _ in range(GRAD_KINDS - 1)]
    which, cols, n_mbs, fixed, adam, grads, chunks = [], [], [], [], [], [], []
    for layout in layouts:
        tp, pp, dp = layout.tp, layout.pp, layout.dp
        q = pairs.get((tp, pp))
        if q is None:
            q = pairs[(tp, pp)] = len(pairs)
            rows = [table.rows(tp, pp, recompute, z3) for z3 in (False, True)
                    for recompute in Recompute]
            stages = len(rows[0])
            depths.append([depth for depth, _ in rows[0]] + [1] * (2 - stages))
            per_mb.append([[[row[b][0] for _, row in by_rc] + [0] * (2 - stages)
                            for by_rc in rows] for b in sizes] + [[[0, 0]] * len(rows)])
            rest.append([[[row[b][1] for _, row in by_rc] + [_NEVER] * (2 - stages)
                          for by_rc in rows] for b in sizes]
                        + [[[_NEVER, _NEVER]] * len(rows)])
            for i, out in ((2, later), (3, emb)):
                out.append([[[row[b][i] for _, row in by_rc] + [NO_MOMENT] * (2 - stages)
                             for by_rc in rows] for b in sizes]
                           + [[[NO_MOMENT, NO_MOMENT]] * len(rows)])
            for w, kind in enumerate(alone):  # moments adding none, one, ... end grads
                kind.append([[[row[b][4 + w] for _, row in by_rc] + [_NEVER] * (2 - stages)
                              for by_rc in rows] for b in sizes]
                        + [[[_NEVER, _NEVER]] * len(rows)])
        which.append(q)
        extra = width - len(layout.mbs)
        cols.append([column[b] for b in layout.mbs] + [pad] * extra)
        n_mbs.append([layout.per_replica // b for b in layout.mbs] + [1] * extra)
        f_z, a_z, g_z, c_z = [], [], [], []
        e_z: list[list] = [[] for _ in ends]
        for zero in range(4):
            if zero and (dp == 1 or zero not in runnable):
                f_z.append((_NEVER, _NEVER))
                a_z.append((-1, -1))
                g_z.append((0, 0))
                c_z.append((0, 0))
                for e in e_z:
                    e.append((0, 0))
                continue
            static = table.static_of(tp, pp, dp, zero)
            if len(static) == 1:
                static = (static[0], (-_NEVER, -1, 0, (0,) * len(ends), 0))
            f_z.append((static[0][0], static[1][0]))
            a_z.append((static[0][1], static[1][1]))
            g_z.append((static[0][2], static[1][2]))
            c_z.append((static[0][4], static[1][4]))
            for i, e in enumerate(e_z):
                e.append((static[0][3][i], static[1][3][i]))
        fixed.append(f_z)
        adam.append(a_z)
        grads.append(g_z)
        chunks.append(c_z)
        for e, end in zip(e_z, ends, strict=True):
            end.append(e)
    which_a = np.array(which)[:, None]
    col_a = np.array(cols)
    # 1F1B keeps min(m, pp - stage) micro-batches in flight, at least one (peaks_in_flight)
    in_flight = np.maximum(np.minimum(np.array(n_mbs)[:, None, :],
                                      np.array(depths)[which][:, :, None]), 1)
    one = np.array(per_mb, dtype=np.int64)[which_a, col_a].transpose(0, 3, 1, 2)
    held = in_flight[:, :, :, None] * one
    # peaks: layout, stage, micro-batch index, recompute -> layout, recompute, stage, index
    peaks = (held + np.array(rest, dtype=np.int64)[which_a, col_a].transpose(0, 3, 1, 2)
             ).transpose(0, 3, 1, 2)
    p = peaks[:, _RC_OF_SAVER]  # layout, saver, stage, micro-batch index
    f = np.array(fixed, dtype=np.int64)[:, _ZERO_OF_SAVER, :, None]
    a = np.array(adam, dtype=np.int64)[:, _ZERO_OF_SAVER, :, None]
    g = np.array(grads, dtype=np.int64)[:, _ZERO_OF_SAVER, :, None]
    n = np.array(n_mbs)[:, None, :]
    single = (n == 1)[:, None]

    def by_saver(x: np.ndarray) -> np.ndarray:  # (layout, stage, index, recompute) rows
        return x.transpose(0, 3, 1, 2)[:, _RC_OF_SAVER]

    # the first stage's embedding moment with ZeRO's chunk (none in a step of one)
    e = by_saver(held + np.array(emb, dtype=np.int64)[which_a, col_a].transpose(0, 3, 1, 2))
    e = np.where(single, NO_MOMENT, e)
    if g.any():  # a step's first backward runs before the gradients exist
        # 1F1B with m <= pp - stage: the first backward with all m in flight, the later ones
        # with one fewer beside every gradient (peaks_in_flight)
        beside = by_saver(held - one + np.array(later, dtype=np.int64)[which_a, col_a].transpose(
            0, 3, 1, 2))
        shallow = (((n >= 2) & (n <= np.array(depths)[which][:, :, None]))[:, None]
                   & (beside > NO_MOMENT // 2))
        e = np.where(shallow, e - by_saver(one), e)
        first = [(held + np.array(kind, dtype=np.int64)[which_a, col_a].transpose(0, 3, 1, 2)
                  ).transpose(0, 3, 1, 2)[:, _RC_OF_SAVER] for kind in alone]
        top = first[0]
        for kind, end in zip(first[1:], ends, strict=True):
            top = np.maximum(top, kind + np.array(end, dtype=np.int64)[:, _ZERO_OF_SAVER, :,
                                                                        None])
        p = np.where(single, top - g, np.where(shallow, np.maximum(beside, top - g), p))
    c = np.array(chunks, dtype=np.int64)[:, _ZERO_OF_SAVER, :, None]
    p = np.maximum(p, e + c)
    return (f + np.maximum(p, a)).max(axis=2)


def _fitting_groups(table: _MemoryTable, layouts: list[_Layout],
                    budgets: list[tuple[float, float]]
                    ) -> list[tuple[list[_Group], list[BoundKey]]]:
    """Per budget (tensor bytes on one GPU, on several: NCCL's buffers only exist in the
    latter), every configuration that fits, by GPU count (in search
    order: counts by first appearance, configurations by layout, then saver, then
    micro-batch), and the distinct lower-bound keys among them.

    Per micro-batch of a layout the cheapest memory saver that fits is kept (the savers only
    cost time), provided the most frugal saver fits at some micro-batch. Memory grows with
    the micro-batch under any saver, except at the last one (one micro-batch per step) when
    the runtime frees the gradients between steps: there none exist during the forward, so
    it may fit where smaller micro-batches do not. The fitting micro-batches are grouped into
    runs of the same cheapest saver (a gap does not split a run).
    Without pipelining (pp = 1) a larger micro-batch with the same saver does the same work
    in fewer, larger GEMMs, so only the largest one of each saver is kept; with pp > 1
    smaller micro-batches shrink the 1F1B bubble, so all are. All layouts and budgets are
    compared at once (``_memory_values``).
    """
    values = _memory_values(table, layouts)
    most = _FRUGAL[max(table.runtime.zero_stages)]  # the runtime's most frugal saver
    frugal = np.array([most if layout.dp > 1 else _FRUGAL[0] for layout in layouts])
    least = values[np.arange(len(layouts)), frugal].min(axis=1)
    table.floor = min(table.floor, int(least.min()))
    several = np.array([layout.tp * layout.pp * layout.dp > 1 for layout in layouts])
    out = []
    for single, multi in budgets:
        budget = np.where(several, multi, single)
        fit = values <= budget[:, None, None]
        cheapest = fit.argmax(axis=1).tolist()
        fit_any = fit.any(axis=1)
        counts = fit_any.sum(axis=1)
        # the usual case: the fitting micro-batches are the first ``count`` ones
        leading = np.where(fit_any.all(axis=1), fit_any.shape[1], fit_any.argmin(axis=1))
        prefix = (leading >= counts).tolist()
        by_count: dict[int, _Group] = {}
        for li, (layout, ok, n_fit, first) in enumerate(zip(
                layouts, (least <= budget).tolist(), counts.tolist(), cheapest, strict=True)):
            if not ok or not n_fit:
                continue  # not even the most frugal saver fits one sequence
            idx = range(n_fit) if prefix[li] else np.flatnonzero(fit_any[li]).tolist()
            n = layout.tp * layout.pp * layout.dp
            group = by_count.get(n)
            if group is None:
                group = by_count[n] = (n, [], [], [])
            _, fills, keys, cfgs = group
            pipelined, no_zero = layout.pp > 1, layout.dp == 1
            lo = 0
            while lo < n_fit:
                saver = first[idx[lo]]
                hi = lo + 1
                while hi < n_fit and first[idx[hi]] == saver:
                    hi += 1
                i = _NO_ZERO_POS[saver] if no_zero else saver
                keep = idx[lo:hi] if pipelined else idx[hi - 1:hi]
                rc_keys = layout.keys[layout.savers[i][0]]
                saver_cfgs = layout.cfgs[i] or layout.saver_cfgs(i)
                fills.extend(layout.fills[c] for c in keep)
                keys.extend(rc_keys[c] for c in keep)
                cfgs.extend(saver_cfgs[c] for c in keep)
                lo = hi
        all_keys = list(dict.fromkeys(k for group in by_count.values() for k in group[2]))
        out.append((list(by_count.values()), all_keys))
    return out


def _plan(table: _MemoryTable, gpu: GpuType, step_model: StepTimeModel, cfg: Config,
          precision: Precision, notes: tuple[str, ...], margin: float,
          non_tensor: NonTensorModel, factor: float = 1.0) -> Plan:
    """The ``Plan`` of a search point: its full memory breakdown (tensors, allocator slack,
    memory outside the allocator) and step time; it needs its device figure plus the
    margin. ``factor`` multiplies the counted tensors (a measured residual)."""
    par = table.par(*cfg)
    counted = table.get(*cfg)
    if factor != 1.0:
        counted = scale_counted(counted, factor)
    mem: MemoryBreakdown = non_tensor.fill(counted, gpu, par.num_gpus)
    return Plan(
        gpu_type=gpu.name, parallel=par, precision=precision, memory=mem,
        step=step_model.estimate(par), num_steps=table.train.num_steps, notes=notes,
        required_bytes=int(mem.device / (1.0 - margin)), runtime=table.runtime.name,
        memory_factor=factor,
    )


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
    runtime: str | RuntimeProfile = DEFAULT_RUNTIME,
    non_tensor: NonTensorModel = NON_TENSOR,
    memory_factors: Mapping[str, tuple[float, str]] | None = None,
    inter_node_bw_gbs: float | None = None,
) -> PlanResult:
    """All plans of ``model`` trained as ``train`` on each GPU type of ``gpus`` (default:
    the whole catalog), ranked; ``keep_all`` keeps every fitting plan, not only the fastest
    per (GPU type, count). Memory is priced for ``runtime`` (a ``predictor.runtimes``
    profile or its name); a plan fits when its device figure (``non_tensor``'s slack and
    outside terms on top of the tensors) is at most ``1 - margin`` of the GPU. Only plans
    the runtime executes are searched (its ``max_pp`` caps ``max_pp``, its ``zero_stages``
    the ZeRO stages); the result's ``notes`` say what it excluded. ``memory_factors`` maps
    a GPU type to a measured correction of the counted tensors and why (an online
    residual, ``predictor.residual``): the fit and every plan of that type use the
    corrected tensors, and the plans' notes say why. Step time is priced for the same
    runtime where it has a step-time profile (``RUNTIME_STEP_PROFILES``), else for the
    built-in trainer's. ``inter_node_bw_gbs`` is the network between the nodes of the
    cluster the job will run on (GB/s per node, what it declares): multi-node plans are
    timed, and so chosen, on it; None times them on each GPU type's usual servers
    (``GpuType.inter_node_bw_gbs``, e.g. a DGX A100's 200 GB/s), which is only right on
    such a cluster."""
    profile = get_runtime(runtime).for_model(model)
    step_runtime = profile.name if profile.name in RUNTIME_STEP_PROFILES else DEFAULT_RUNTIME
    train.check_against(model)
    profile.check_runs(model, train.optimizer.value)
    if not 0 <= margin < 1:
        raise SpecError("margin", f"must be in [0, 1), got {margin}")
    if max_gpus < 1:
        raise SpecError("max_gpus", f"must be >= 1, got {max_gpus}")
    if inter_node_bw_gbs is not None and not inter_node_bw_gbs > 0:
        raise SpecError("inter_node_bw_gbs", f"must be > 0, got {inter_node_bw_gbs}")
    rank_key = RANKINGS.get(ranking) if isinstance(ranking, str) else ranking
    if rank_key is None:
        raise SpecError("ranking", f"unknown ranking {ranking!r}; one of {', '.join(RANKINGS)}")
    gpu_list = list(gpus) if gpus is not None else list(load_gpu_catalog().values())
    if not gpu_list:
        raise SpecError("gpus", "no GPU types to plan for")

    best: dict[tuple[str, int], Plan] = {}  # the fastest plan per (GPU type, count)
    every: list[Plan] = []
    table = _MemoryTable(model, train, profile)
    factors = {g.name: (memory_factors or {}).get(g.name, (1.0, "")) for g in gpu_list}
    budgets = [(non_tensor.budget(gpu.memory_bytes, gpu, 1, margin) / factors[gpu.name][0],
                non_tensor.budget(gpu.memory_bytes, gpu, 2, margin) / factors[gpu.name][0])
               for gpu in gpu_list]
    bounds: dict[tuple[float, float, Precision], tuple[ComputeBound, dict[BoundKey, float]]] = {}
    if profile.max_pp:
        max_pp = min(max_pp, profile.max_pp)
    search_notes = tuple(n for n in (profile.excluded_note(),) if n)
    shapes = [(tp, pp, dp) for tp in _tp_options(model, train, min(gpus_per_node, max_gpus))
              for pp in _divisors(model.num_layers, min(max_pp, max_gpus // tp))
              for dp in _divisors(train.global_batch, max_gpus // (tp * pp))]
    distinct = list(dict.fromkeys(budgets))  # GPU types of equal budget share the fit

    def fit(among: list[tuple[int, int, int]]) -> dict:
        return dict(zip(distinct, _fitting_groups(
            table, [_Layout(table, *shape) for shape in among], distinct), strict=True))

    if profile.pp_when_needed and any(pp > 1 for _, pp, _ in shapes):
        # single-stage plans first; pipelines only when none fits on any GPU type (the
        # search's cost grows with the (tp, pp) pairs)
        fitting = fit([shape for shape in shapes if shape[1] == 1])
        if any(groups for groups, _ in fitting.values()):
            search_notes = (*search_notes, f"runtime {profile.name} searches pipeline stages "
                            "only when no single-stage plan fits any GPU type")
        else:
            fitting = fit(shapes)
            search_notes = (*search_notes, f"runtime {profile.name}: no single-stage plan "
                            "fits any GPU type, so pipeline stages were searched")
    else:
        fitting = fit(shapes)
    flash, sp_knob = train.flash_attention, train.sequence_parallel
    considered = 0
    for gpu, budget in zip(gpu_list, budgets, strict=True):
        precision, notes = _precision_for(gpu, train.precision)
        factor, why = factors[gpu.name]
        if why:
            notes = (*notes, why)
        gtrain = train if precision is train.precision else replace(train, precision=precision)
        groups, all_keys = fitting[budget]
        # the lower bound's dp-free part depends on the GPU only through its rates
        rates = (*device_rates(gpu, gtrain.precision, step_runtime), gtrain.precision)
        bound = bounds.get(rates)
        if bound is None:
            bound = bounds[rates] = (ComputeBound(model, gtrain, gpu, flash, sp_knob,
                                                  step_runtime), {})
        per_micro = bound[1]
        per_micro_batch = bound[0].per_micro_batch
        per_micro.update({key: per_micro_batch(*key) for key in all_keys if key not in per_micro})
        compute: dict = {}  # per-micro-batch compute times of this GPU type (any count)
        for n, fills, keys, cfgs in groups:
            # compute_lower_bound = (m + pp - 1) x its dp-free part, for each configuration;
            # candidates in increasing bound (ties: in search order)
            bounds_n = list(map(mul, fills, map(per_micro.__getitem__, keys)))
            step_model = StepTimeModel(model, gtrain, gpu,
                                       default_topology(gpu, n, gpus_per_node, inter_node_bw_gbs),
                                       compute, step_runtime)
            best_total, best_cfg = 0.0, None
            for i in sorted(range(len(bounds_n)), key=bounds_n.__getitem__):
                if not keep_all and best_cfg is not None and bounds_n[i] >= best_total:
                    break  # sorted by bound: nothing after this can be faster
                considered += 1
                cfg = cfgs[i]
                total = step_model.total_s(*cfg, sp_knob, flash)
                if keep_all:
                    every.append(_plan(table, gpu, step_model, cfg, precision, notes, margin,
                                       non_tensor, factor))
                if best_cfg is None or total < best_total:
                    best_total, best_cfg = total, cfg
            if best_cfg is not None and not keep_all:  # built once, for the fastest only
                best[(gpu.name, n)] = _plan(table, gpu, step_model, best_cfg, precision, notes,
                                            margin, non_tensor, factor)

    candidates = every if keep_all else list(best.values())
    if not candidates:
        largest = max(gpu_list, key=lambda g: g.memory_bytes)
        need = min(
            non_tensor.fill(MemoryBreakdown(table.floor, 0, 0, 0, 0, 0), g, 2).device
            for g in gpu_list) / (1.0 - margin)
        top_zero = max(profile.zero_stages)
        frugal = (f"tp<={gpus_per_node}, pp<={max_pp}, "
                  f"{f'ZeRO-{top_zero}' if top_zero else 'no ZeRO'}, full recomputation")
        runtime_hint = (f"; runtime {profile.name} executes {profile.executes}, another "
                        "runtime (or an entrypoint) may fit" if profile.executes else "")
        return PlanResult(
            model=model, train=train, plans=(), considered=considered, min_required_bytes=int(need),
            infeasible=(
                f"{model.name} needs at least {need / GIB:.1f} GiB per GPU even with the most "
                f"memory-saving plan within {max_gpus} GPUs ({frugal}); the largest GPU "
                f"considered, {largest.name}, has {largest.memory_gib:.1f} GiB. Use more GPUs "
                f"(max_gpus), a shorter sequence or a smaller global batch{runtime_hint}."
            ),
            notes=search_notes,
        )
    ordered = sorted(candidates, key=rank_key)
    return PlanResult(
        model=model, train=train, plans=tuple(_with_reasons(ordered, ranking)),
        considered=considered, notes=search_notes,
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
