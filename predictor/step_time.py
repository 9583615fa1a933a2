"""Analytical step-time model of one training step (one optimizer update) of a parallel plan.

What it predicts and why it is built this way (DESIGN §3; vTrain, Pipette, Calculon, Megatron):

* **Compute** is counted from the model's matmul FLOPs, layer by layer (QKV with GQA, the
  attention core ``4·b·s²·q`` with q = heads·head_dim, output projection, 2- or 3-matrix MLP,
  logits), ×3 for forward+backward, + one more layer forward under full recomputation (×4/3
  of the layer math), + the attention core under selective recomputation (under a runtime
  with torchtitan's per-op SAC, the unsaved linears and the element-wise work), divided by
  ``tp``. Each GEMM runs at ``peak · e(F)`` with the size-dependent efficiency
  ``e(F) = e_max · F / (F + F_half)``: small GEMMs run far below peak (Calculon's step
  curve, made smooth). Algebraically a GEMM of F FLOPs takes
  ``(F + F_half) / (peak · e_max)``, i.e. its FLOPs at the asymptotic rate plus a fixed cost —
  which is also what kernel-launch and tail effects look like. Memory-bound element-wise work
  (norms, activations, dropout, residuals, softmax without flash, the fp32 loss) is counted
  in bytes over the GPU's memory bandwidth: Megatron's fused layer by default, the eager
  Hugging Face layer under autocast over fp32 weights for a runtime that runs the model's
  own code (``hf_elementwise_bytes``, with its weight casts per micro-batch and the upcast
  loss). The matmul rate depends on the training
  runtime (``predictor.step_calibration``): whether its fp32 matmuls run on TF32, and the
  calibrated efficiency per (GPU type, matmul mode).
* **Host dispatch floor**: kernels and collectives are launched asynchronously, so one layer
  pass takes ``max(GPU work + its tensor-parallel collectives, passes · LAYER_OVERHEAD_S)``
  (backward counts as two passes); collectives of a launch-bound layer cost nothing extra.
  Each micro-batch also pays the runtime's own work once per stage (``MICRO_BATCH_OVERHEAD_S``).
  Both are the runtime profile's where it has its own (``host_overheads``).
* **Tensor-parallel collectives**: 4 all-reduces of ``b·s·h`` activations per layer per
  micro-batch (2 forward, 2 backward; +2 when full recomputation re-runs the forward), ring cost
  ``α + 2(t−1)/t · bytes / busbw`` on the link the group really uses. Forward all-reduces sit on
  the critical path; the backward ones are issued asynchronously alongside the weight-gradient
  GEMM in Megatron, so only ``1 − TP_BWD_OVERLAP`` of them is exposed — or, under a profile
  with ``tp_bwd_behind_wgrad``, what each outlasts the weight-gradient GEMM of its own layer
  (attention QKV, MLP input).
* **Pipeline (1F1B)**: ``m·t`` of the slowest stage plus the fill and drain through the other
  stages (``(p − 1)·t`` without the head for an even split, divided by ``v`` interleaved
  chunks); an explicit uneven split (``par.extra["stage_layers"]``) takes its slowest stage
  and the sum of the others, plus Pipette's hidden critical path: the stage-to-stage p2p
  transfers of ``b·s·h`` activations, ``2(p − 1)`` of them per round of the bubble path,
  repeated ``max(1, m/p)`` times (Pipette Eq. 3–5 with uniform links).
* **Data parallel**: gradient all-reduce ``2(d−1)/d · params/rank · grad bytes / busbw``
  (hierarchical when the group spans nodes). A runtime that buckets it into the backward
  (DDP, FSDP) exposes the part exceeding the last micro-batch's backward and at least the
  last layer's bucket; one that issues it after the backward (Megatron-LM, DeepSpeed ZeRO-0/1)
  exposes all of it; ZeRO-3 adds two parameter all-gathers
  per micro-batch, hidden behind compute up to what compute can cover.
* **Optimizer**: memory-bound, the runtime's bytes per parameter (its optimizer kernels) over
  HBM bandwidth.

Constants: the per-GPU ones (a-priori ``matmul_efficiency``, NCCL efficiency and latency,
default network bandwidth) live in ``predictor/data/gpus.yaml``, calibrated efficiencies and runtime
profiles in ``predictor/step_calibration.py``; the GPU-independent constants below were
calibrated on the declared calibration split and validated on the rest
(``python -m benchmarks.step_time_accuracy``; docs/step_time_accuracy.md).

Pure arithmetic: no I/O, no torch; one call is a few microseconds (the planner makes hundreds
per job, through ``StepTimeModel``, which caches what depends only on the layout).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from predictor.gpus import GpuType
from predictor.spec import (
    LLAMA_LAYOUT,
    Family,
    ModelSpec,
    ParallelConfig,
    Precision,
    Recompute,
    TrainingSpec,
)
from predictor.step_calibration import DEFAULT_RUNTIME, matmul_rate, runtime_step_profile

# --- GPU-independent constants ----------------------------------------------------------
# GEMM size (FLOPs) at which a GEMM reaches half of the GPU's asymptotic matmul efficiency.
# Calibrated on vTrain single-node (1,440 A100 runs) only; see docs/step_time_accuracy.md.
GEMM_HALF_FLOPS = 0.6e9
# Bytes moved by element-wise kernels per layer forward, in units of one activation tensor
# (b·s·h elements): 2 layer norms (read+write, 2 passes each), 2 dropouts, 2 residual adds,
# bias adds — counted from Megatron's layer, not fitted.
ELEMENTWISE_PASSES_H = 16.0
# ... and per element of the MLP's hidden activation (b·s·f): bias+GeLU / SwiGLU read+write.
ELEMENTWISE_PASSES_F = 4.0
# ... and per attention-score element (b·a·s²) without flash attention: scale+mask+softmax+
# dropout, read+write.
SOFTMAX_PASSES = 4.0
# ... and per element of Q and K (b·s·heads·head_dim, b·s·kv_heads·head_dim) of a model with
# per-head q/k norms (qwen3): one RMSNorm each, read+write.
QK_NORM_PASSES = 2.0
# Flash attention's achieved rate relative to a dense GEMM of the same FLOPs (forward), and its
# backward FLOPs relative to its forward (it recomputes the scores): FlashAttention-2 paper.
FLASH_RELATIVE_EFFICIENCY = 0.7
FLASH_BWD_FLOPS_RATIO = 2.5
# Host-side dispatch time per layer per pass (forward, recompute-forward; backward counts
# twice): kernel launches and framework work. A floor under the layer's GPU time, since
# launches are asynchronous. Calibrated on vTrain single.
LAYER_OVERHEAD_S = 8.0e-4
# Fraction of a layer's tensor-parallel collectives that stays exposed when the host's
# dispatch floor, not the GPU, bounds the layer: NCCL calls cost host time of their own and
# wait for the slowest rank. Calibrated on vTrain single over {0, 0.5, 1}: 0 fits best, i.e.
# the collectives hide under the floor entirely (docs/step_time_accuracy.md).
TP_FLOOR_EXPOSED = 0.0
# The runtime's own host work per micro-batch and stage (forward/backward calls, loss scaling,
# the pipeline engine's send/receive bookkeeping), m + p − 1 of them on the critical path.
# Calibrated on vTrain single (Megatron-DeepSpeed) only.
MICRO_BATCH_OVERHEAD_S = 2.0e-3
# Extra NCCL latency per ring step: A100 nccl-tests (vTrain LUT) 1 MiB all-reduce takes 44 µs on
# 2 GPUs and 93 µs on 8, i.e. ~30 µs + ~8 µs·(n − 1).
NCCL_STEP_LATENCY_S = 8.0e-6
# Fraction of the backward tensor-parallel all-reduces hidden behind weight-gradient GEMMs
# (Megatron issues the input-gradient all-reduce asynchronously before the wgrad GEMM).
TP_BWD_OVERLAP = 0.5
# Fraction of peak memory bandwidth element-wise and optimizer kernels reach (STREAM-like).
MEMORY_EFFICIENCY = 0.8
# HBM bytes per parameter of one optimizer step. Adam/AdamW: the runtime's figure
# (``RuntimeStepProfile.optimizer_bytes``); these are the fallbacks. Adam mixed precision: read
# fp32 master, grad, m, v (16 B); write master, m, v and the half copy (14 B). SGD with
# momentum: 4+4+4 read, 4+4+2 write.
OPTIMIZER_BYTES = {"adam": 30.0, "adamw": 30.0, "sgd": 22.0}


@dataclass(frozen=True, slots=True)
class Topology:
    """Where a plan's GPUs sit: how many nodes and the links the groups really use.

    Ranks are laid out by ``rank_order`` (innermost axis first). The default ``"tp-dp-pp"`` is
    Megatron-LM's (tensor-parallel ranks adjacent, then data-parallel, pipeline outermost), so
    tp groups stay inside a node as long as ``tp ≤ gpus per node``. ``"tp-pp-dp"`` puts whole
    pipelines on a node and data parallelism across nodes (DeepSpeed's pipe/data topology,
    Sia's pipeline jobs).

    ``inter_bw_gbs`` is the per-node network bandwidth (GB/s, one direction), shared by all
    groups crossing the node boundary at once. 12.5 GB/s = one 100 Gb/s NIC, a modest default
    for clusters that are not DGX-class (a DGX A100 has 8×200 Gb/s = 200 GB/s).
    """

    num_nodes: int = 1
    intra_link: str | None = None
    intra_bw_gbs: float | None = None
    inter_bw_gbs: float = 12.5
    gpus_per_node: tuple[int, ...] = ()
    rank_order: str = "tp-dp-pp"

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {self.num_nodes}")
        if self.intra_link not in (None, "nvlink", "pcie"):
            raise ValueError(f"intra_link must be nvlink, pcie or None, got {self.intra_link!r}")
        if self.rank_order not in ("tp-dp-pp", "tp-pp-dp"):
            raise ValueError(f"rank_order must be tp-dp-pp or tp-pp-dp, got {self.rank_order!r}")
        if self.gpus_per_node and len(self.gpus_per_node) != self.num_nodes:
            raise ValueError("gpus_per_node must list one count per node")
        if not self.inter_bw_gbs > 0:
            raise ValueError("inter_bw_gbs must be > 0")

    # -- layout ----------------------------------------------------------------------------
    def node_size(self, num_gpus: int) -> int:
        """GPUs per node used for group placement (the largest node, or an even spread)."""
        if self.gpus_per_node:
            return max(self.gpus_per_node)
        return max(1, math.ceil(num_gpus / self.num_nodes))

    def nodes_spanned(self, par: ParallelConfig, axis: str) -> int:
        """How many nodes one group of ``axis`` ("tp", "dp" or "pp") spans."""
        return self.spans(par.tp, par.pp, par.dp)[("tp", "pp", "dp").index(axis)]

    def spans(self, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
        """Nodes spanned by one tensor-, pipeline- and data-parallel group of that layout."""
        nodes = self.num_nodes
        if nodes == 1:
            return 1, 1, 1
        g = self.node_size(tp * pp * dp)
        if self.rank_order == "tp-dp-pp":
            pp_stride, dp_stride = tp * dp, tp
        else:
            pp_stride, dp_stride = tp, tp * pp
        return (_span(tp, 1, g, nodes), _span(pp, pp_stride, g, nodes),
                _span(dp, dp_stride, g, nodes))

    def tp_crosses_nodes(self, par: ParallelConfig) -> bool:
        return self.nodes_spanned(par, "tp") > 1

    def dp_crosses_nodes(self, par: ParallelConfig) -> bool:
        return self.nodes_spanned(par, "dp") > 1

    def pp_crosses_nodes(self, par: ParallelConfig) -> bool:
        return self.nodes_spanned(par, "pp") > 1


def _span(size: int, stride: int, node_size: int, nodes: int) -> int:
    """Nodes spanned by a group of ``size`` ranks ``stride`` apart, ``node_size`` per node."""
    if size == 1:
        return 1
    if stride >= node_size:  # every member on its own node
        return min(size, nodes)
    return min(size, math.ceil(size * stride / node_size), nodes)


@dataclass(frozen=True, slots=True)
class StepTime:
    """One optimizer step's time and where it goes (seconds; the parts sum to ``total_s``)."""

    compute_s: float
    tp_comm_s: float
    pp_bubble_s: float
    pp_p2p_s: float
    dp_comm_s: float
    optimizer_s: float
    total_s: float

    def as_dict(self) -> dict[str, float]:
        return {
            "compute_s": self.compute_s,
            "tp_comm_s": self.tp_comm_s,
            "pp_bubble_s": self.pp_bubble_s,
            "pp_p2p_s": self.pp_p2p_s,
            "dp_comm_s": self.dp_comm_s,
            "optimizer_s": self.optimizer_s,
            "total_s": self.total_s,
        }


def default_topology(gpu: GpuType, num_gpus: int, gpus_per_node: int = 8,
                     inter_bw_gbs: float | None = None) -> Topology:
    """What the planner assumes before placement: GPUs packed onto full nodes of
    ``gpus_per_node``, the GPU type's default link inside a node, and between nodes the
    network ``inter_bw_gbs`` the cluster declares (None: the GPU type's usual network, for
    a plan made without a cluster in mind)."""
    nodes = max(1, math.ceil(num_gpus / gpus_per_node))
    return Topology(num_nodes=nodes, inter_bw_gbs=gpu.inter_node_bw_gbs
                    if inter_bw_gbs is None else inter_bw_gbs)


# --- building blocks ---------------------------------------------------------------------
def _act_bytes(precision: Precision) -> int:
    return 4 if precision is Precision.FP32 else 2


def _gemm_s(flops: float, rate: float) -> float:
    """Seconds for one GEMM: FLOPs at the asymptotic rate plus the half-efficiency offset."""
    return (flops + GEMM_HALF_FLOPS) / rate


def _collective_s(
    nbytes: float, members: int, bus_gbs: float, latency_s: float, factor: float = 2.0
) -> float:
    """Ring collective: ``α + factor·(n−1)/n · bytes / busbw`` (factor 2: all-reduce,
    1: reduce-scatter or all-gather). Zero for a group of one."""
    if members <= 1 or nbytes <= 0:
        return 0.0
    latency_s += NCCL_STEP_LATENCY_S * (members - 1) * factor / 2.0
    return latency_s + factor * (members - 1) / members * nbytes / (bus_gbs * 1e9)


def _group_collective_s(
    nbytes: float,
    members: int,
    nodes: int,
    groups_per_node: int,
    intra_bus_gbs: float,
    inter_gbs: float,
    latency_s: float,
    factor: float = 2.0,
) -> float:
    """A collective of a group spanning ``nodes`` nodes, hierarchical like NCCL/Pipette: the
    intra-node part on the node's link, the inter-node part on the network, whose per-node
    bandwidth is shared by the ``groups_per_node`` groups talking across nodes at once."""
    if members <= 1:
        return 0.0
    if nodes <= 1:
        return _collective_s(nbytes, members, intra_bus_gbs, latency_s, factor)
    per_node = max(1, members // nodes)
    intra = _collective_s(nbytes, per_node, intra_bus_gbs, latency_s, factor)
    inter = _collective_s(nbytes, nodes, inter_gbs / max(1, groups_per_node), latency_s, factor)
    return intra + inter


@dataclass(frozen=True, slots=True)
class _Links:
    intra_bus_gbs: float  # achievable bus bandwidth inside a node
    intra_p2p_gbs: float
    inter_gbs: float  # achievable per-node network bandwidth
    latency_s: float


def _links(gpu: GpuType, topo: Topology) -> _Links:
    link = topo.intra_link or gpu.link
    if topo.intra_bw_gbs is not None:
        raw = topo.intra_bw_gbs
    elif link == gpu.link:
        raw = gpu.link_bw_gbs
    else:
        raw = gpu.pcie_bw_gbs if link == "pcie" else gpu.link_bw_gbs
    eff = gpu.nccl_efficiency
    return _Links(
        intra_bus_gbs=raw * eff,
        intra_p2p_gbs=raw * eff,
        inter_gbs=topo.inter_bw_gbs * eff,
        latency_s=gpu.nccl_latency_us * 1e-6,
    )


def hf_elementwise_bytes(model: ModelSpec, precision: Precision) -> tuple[float, float, float]:
    """Bytes the element-wise kernels of one eager Hugging Face layer move in its forward,
    per token·h element, per token·f element (f: the MLP's hidden width) and per element of
    the rotated Q and K (token·(heads + kv_heads)·head_dim), counted from transformers'
    modeling code as the Trainer runs it: fp32 weights under autocast, so the residual
    stream and every norm are fp32 (4 B) and each linear that reads the stream first casts
    its input to half (4 + a bytes, a = the half width; nothing in an fp32 run).

    * llama layout: two composite RMSNorms (pow, mean, the rsqrt product, the weight
      product: 7 fp32 passes each), five input casts (q, k, v, gate, up), two residual adds
      (fp32 + half into fp32: 4 + a + 4), the attention output's transpose copy (2a per Q
      element); rotary with fp32 cos / sin promotes Q and K to fp32 (q·cos, rotate_half's neg
      and cat, ·sin, the sum: 5a + 20) and sdpa casts them back (4 + a); Qwen3's per-head
      RMSNorm on Q and K (4a + 28); SwiGLU silu and product over f (5a).
    * gpt2 (and OPT, gpt2 with ReLU; BERT): two native LayerNorms (2 fp32 passes each), the
      fused c_attn's and c_fc's input casts (OPT's and BERT's separate q, k, v: four), two
      residual adds, the transpose copy, the residual dropouts where the config sets them
      (2a + 1 each: output and the byte mask); gelu_new's eight-op chain over f (18a), else
      one activation kernel (2a).
    * gpt_neox: two LayerNorms, two input casts, the parallel residual (two adds), rotary on
      a quarter of each head (Pythia's rotary_pct) plus the cat that rejoins it (2a).
    """
    mixed = precision is not Precision.FP32
    a = 2.0 if mixed else 4.0
    cast = (4.0 + a) if mixed else 0.0
    residual = 8.0 + a
    q_share = model.attn_hidden / model.hidden_size
    if model.family in LLAMA_LAYOUT:
        n_cast = 5 if model.swiglu else 4
        per_h = 2 * 28.0 + n_cast * cast + 2 * residual + 2 * a * q_share
        per_f = 5.0 * a if model.swiglu else 2.0 * a
        per_qk = 5 * a + 20.0 + cast + (4 * a + 28.0 if model.qk_norm else 0.0)
        return per_h, per_f, per_qk
    if model.family is Family.GPT_NEOX:
        per_h = 2 * 8.0 + 2 * cast + (3 * a) + residual + 2 * a * q_share
        return per_h, 2.0 * a, 0.25 * (5 * a + 20.0) + 2 * a + cast
    separate_qkv = model.activation == "relu" or model.family is Family.BERT
    dropouts = 2 if (model.config_hidden_dropout or 0.0) > 0 else 0
    per_h = (2 * 8.0 + (4 if separate_qkv else 2) * cast + 2 * residual + 2 * a * q_share
             + dropouts * (2 * a + 1.0))
    per_f = 18.0 * a if model.config_gelu_composite else 2.0 * a
    return per_h, per_f, 0.0


def hf_loss_bytes(precision: Precision) -> float:
    """Bytes per logit of the eager Hugging Face loss, forward and backward: the half logits
    upcast (a + 4, none in fp32), log-softmax (4 + 4), the NLL gradient (4), log-softmax's
    backward (4 + 4 + 4) and the cast back (4 + a)."""
    if precision is Precision.FP32:
        return 24.0
    a = 2.0
    return (a + 4) + 8 + 4 + 12 + (4 + a)


def _layer_times_of(
    model: ModelSpec, s: int, precision: Precision, b: int, t: int, recompute: Recompute,
    flash: bool, sp_knob: bool, rate: float, mem_bps: float, op_sac: bool = False,
    hf: tuple[float, float, float] | None = None,
) -> tuple[float, float, float]:
    """(forward, backward, recompute-forward) seconds of one layer for one micro-batch of
    ``b`` sequences on one tensor-parallel rank; ``op_sac``: selective recomputation is
    torchtitan's per-op SAC (``RuntimeStepProfile.selective_op_sac``)."""
    index = 3 if op_sac and recompute is Recompute.SELECTIVE else _REDO_INDEX[recompute]
    return _layer_times(model, s, precision, b, t, flash, sp_knob and t > 1, rate,
                        mem_bps, hf)[index]


_REDO_INDEX = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}


@functools.lru_cache(maxsize=65536)
def _layer_times(
    model: ModelSpec, s: int, precision: Precision, b: int, t: int, flash: bool,
    sp_knob: bool, rate: float, mem_bps: float, hf: tuple[float, float, float] | None = None,
) -> tuple[tuple[float, float, float], ...]:
    """``_layer_times_of`` under each recomputation mode (none, selective, full, per-op
    SAC): they share the forward and backward. Cached because the planner asks for the same
    layer shape under many (pp, dp) layouts, savers and GPU types of equal rates."""
    h, f, kv, a = model.hidden_size, model.ffn_hidden_size, model.kv_hidden, model.num_heads
    qw = model.attn_hidden  # Q and attention-output width: h unless head_dim is explicit
    tokens = b * s
    nbytes = _act_bytes(precision)
    n_mlp = 3 if model.swiglu else 2

    # QKV, attention output projection, then 2 or 3 MLP GEMMs of one size; summed in that
    # order (as ``sum`` over the GEMM times would)
    half = GEMM_HALF_FLOPS
    mlp = (2.0 * tokens * h * f / t + half) / rate
    dense_fwd = ((2.0 * tokens * h * (qw + 2 * kv) / t + half) / rate
                 + (2.0 * tokens * h * qw / t + half) / rate + mlp + mlp)
    if n_mlp == 3:
        dense_fwd += mlp
    dense_bwd = 2.0 * dense_fwd  # dgrad + wgrad GEMMs of the same sizes

    core_flops = 4.0 * b * s * s * qw / t  # QK^T and PV, full square (no causal skipping)
    if flash:
        core_fwd = _gemm_s(core_flops, rate * FLASH_RELATIVE_EFFICIENCY)
        core_bwd = FLASH_BWD_FLOPS_RATIO * core_fwd
        softmax = 0.0
    else:
        core_fwd = 2 * _gemm_s(core_flops / 2, rate)
        core_bwd = 2.0 * core_fwd
        softmax = SOFTMAX_PASSES * b * (a / t) * s * s * nbytes / mem_bps

    sp = sp_knob and t > 1
    if hf is not None:  # the eager Hugging Face layer (``hf_elementwise_bytes``)
        per_h, per_f, per_qk = hf
        elem = (per_h * tokens * h / (t if sp else 1) + per_f * tokens * f / t
                + per_qk * tokens * (qw + kv) / t) / mem_bps + softmax
    else:
        elem_h = ELEMENTWISE_PASSES_H * tokens * h * nbytes / (t if sp else 1)
        elem_f = ELEMENTWISE_PASSES_F * tokens * f * (n_mlp - 1) * nbytes / t
        elem = (elem_h + elem_f) / mem_bps + softmax
        if model.qk_norm:
            elem += QK_NORM_PASSES * tokens * (qw + kv) * nbytes / t / mem_bps

    # GPU time only: the host's dispatch floor is applied by the caller, over the GPU work
    # and the tensor-parallel collectives of the layer together (see ``_floored``).
    fwd = dense_fwd + core_fwd + elem
    bwd = dense_bwd + core_bwd + 2.0 * elem
    # per-op SAC re-runs the element-wise work and the linears whose outputs it did not save
    per_token = {"q": h * qw, "k": h * kv, "v": h * kv, "qkv": h * (qw + 2 * kv), "o": qw * h,
                 "gate": h * f, "up": h * f, "down": f * h}
    sac = elem + sum((2.0 * tokens * per_token[name] / t + half) / rate
                     for name, saved in model.op_sac_linears() if not saved)
    return (fwd, bwd, 0.0), (fwd, bwd, core_fwd + softmax), (fwd, bwd, fwd), (fwd, bwd, sac)


@functools.lru_cache(maxsize=4096)
def _stage_params_of(model: ModelSpec, tp: int, pp: int) -> float:
    """Parameters held by one rank of the largest pipeline stage (cached: asked once per
    layout)."""
    layers = model.num_layers / pp * model.layer_params()
    if pp == 1:
        edge = model.embedding_params() + model.head_params()
    else:  # the first stage holds the embeddings, the last the head (+ tied copy)
        head = model.head_params() + (model.vocab_size * model.hidden_size
                                      if model.tie_embeddings else 0)
        edge = max(model.embedding_params(), head)
    return (layers + edge) / tp


def device_rates(gpu: GpuType, precision: Precision, runtime: str = DEFAULT_RUNTIME
                 ) -> tuple[float, float]:
    """(asymptotic matmul FLOP/s, achievable memory bytes/s) of ``gpu`` in ``precision`` under
    ``runtime`` (which says whether fp32 matmuls use TF32): all that the compute terms of a
    step depend on from the GPU."""
    return (matmul_rate(gpu, precision, runtime), gpu.mem_bw_gbs * 1e9 * MEMORY_EFFICIENCY)


def _floored(gpu_s: float, comm_s: float, passes: float, floor_s: float
             ) -> tuple[float, float]:
    """(compute, exposed communication) of one layer pass whose GPU work takes ``gpu_s`` and
    whose tensor-parallel collectives take ``comm_s`` on the same stream, under the host's
    dispatch floor of ``passes`` × ``floor_s`` (the runtime's per-pass floor). Kernels and
    collectives are launched asynchronously, so the floor covers both: a collective issued
    while the host is still launching costs nothing extra (vTrain and Domino overlap it the
    same way)."""
    floor = passes * floor_s
    compute = gpu_s if gpu_s > floor else floor
    both = max(gpu_s + comm_s, floor + TP_FLOOR_EXPOSED * comm_s)
    return compute, both - compute


def host_overheads(runtime: str = DEFAULT_RUNTIME) -> tuple[float, float]:
    """(host dispatch floor per layer pass, the runtime's work per micro-batch and stage) of
    ``runtime``: its profile's calibrated figures, else the module's ``LAYER_OVERHEAD_S`` and
    ``MICRO_BATCH_OVERHEAD_S`` (read at call time)."""
    profile = runtime_step_profile(runtime)
    floor = profile.layer_overhead_s
    micro = profile.micro_batch_overhead_s
    return (LAYER_OVERHEAD_S if floor is None else floor,
            MICRO_BATCH_OVERHEAD_S if micro is None else micro)


def compute_lower_bound(
    model: ModelSpec, train: TrainingSpec, gpu: GpuType, *, tp: int, pp: int, dp: int,
    micro_batch: int, recompute: Recompute, flash: bool, sequence_parallel: bool,
    runtime: str = DEFAULT_RUNTIME,
) -> float:
    """A lower bound of ``estimate_step_time(...).total_s`` of that configuration for any
    topology: the step's compute and pipeline bubble without communication (every other
    term is >= 0; the planner never interleaves stages). Cheap (cached layer
    times, no ``ParallelConfig`` needed), so a search can skip configurations that cannot
    beat the best one found. It is ``(m + pp − 1) · lower_bound_per_micro_batch(...)`` with
    ``m`` micro-batches per replica."""
    per_micro = lower_bound_per_micro_batch(
        model, train, gpu, tp=tp, pp=pp, micro_batch=micro_batch, recompute=recompute,
        flash=flash, sequence_parallel=sequence_parallel, runtime=runtime)
    m = max(1, train.global_batch // (dp * micro_batch))
    return (m + pp - 1) * per_micro  # compute + the 1F1B bubble without its communication


def lower_bound_per_micro_batch(
    model: ModelSpec, train: TrainingSpec, gpu: GpuType, *, tp: int, pp: int,
    micro_batch: int, recompute: Recompute, flash: bool, sequence_parallel: bool,
    runtime: str = DEFAULT_RUNTIME,
) -> float:
    """The part of ``compute_lower_bound`` that does not depend on ``dp``: one micro-batch's
    forward and backward (with recomputation) on the slowest stage, without communication.
    A search over data-parallel sizes computes it once per (tp, pp, micro-batch, saver)."""
    return ComputeBound(model, train, gpu, flash, sequence_parallel, runtime).per_micro_batch(
        tp, pp, micro_batch, recompute)


def _layer_passes(lf: float, lb: float, lr: float, recompute: Recompute, c_f: float,
                  c_b: float, floor_s: float) -> tuple[float, float, float, float]:
    """(forward compute, forward exposed comm, backward+recompute compute, their exposed
    comm) of one layer for one micro-batch: GPU times ``lf``, ``lb``, ``lr`` (recompute) and
    the per-pass tensor-parallel collectives ``c_f`` (forward, and a full recompute's
    re-forward) and ``c_b`` (exposed part of the backward's), each pass under its floor of
    ``floor_s`` per pass."""
    f, cf = _floored(lf, c_f, 1.0, floor_s)
    b, cb = _floored(lb, c_b, 2.0, floor_s)
    if recompute is Recompute.FULL:
        r, cr = _floored(lr, c_f, 1.0, floor_s)
        b, cb = b + r, cb + cr
    else:  # selective: the attention core re-run inside the backward, no floor of its own
        b += lr
    return f, cf, b, cb


def _hf_cast_bytes(nbytes: int, recompute: Recompute) -> float:
    """Bytes per parameter one micro-batch of a half-precision eager Hugging Face run moves
    casting weights: each fp32 weight to half in the forward (again in a full recompute's
    re-forward), and its half gradient back to fp32 (4 + ``nbytes`` each); none in an fp32
    run (``nbytes`` 4)."""
    if nbytes >= 4:
        return 0.0
    return (4.0 + nbytes) * ((2 if recompute is Recompute.FULL else 1) + 1)


def _eager_terms(model: ModelSpec, precision: Precision, runtime: str
                 ) -> tuple[tuple[float, float, float] | None, float]:
    """(the eager Hugging Face layer's element-wise bytes, or None for Megatron's count;
    the loss's bytes per logit, forward and backward) under ``runtime``."""
    if runtime_step_profile(runtime).eager_hf:
        return hf_elementwise_bytes(model, precision), hf_loss_bytes(precision)
    return None, 2 * 3 * 4.0  # 3 fp32 passes over the logits, forward and backward


class ComputeBound:
    """``lower_bound_per_micro_batch`` for many configurations of one job on one GPU type:
    the per-layer and head times of a (tp, micro-batch, recompute) are looked up once and
    shared by every pipeline depth."""

    __slots__ = ("_cache", "_flash", "_floor", "_hf", "_loss_bytes", "_mem_bps", "_micro",
                 "_op_sac", "_rate", "_sp", "model", "train")

    def __init__(self, model: ModelSpec, train: TrainingSpec, gpu: GpuType, flash: bool,
                 sequence_parallel: bool, runtime: str = DEFAULT_RUNTIME) -> None:
        self.model, self.train = model, train
        self._rate, self._mem_bps = device_rates(gpu, train.precision, runtime)
        self._flash, self._sp = flash, sequence_parallel
        self._floor, self._micro = host_overheads(runtime)
        self._op_sac = runtime_step_profile(runtime).selective_op_sac
        self._hf, self._loss_bytes = _eager_terms(model, train.precision, runtime)
        self._cache: dict[tuple[int, int, Recompute], tuple[float, float, float]] = {}

    def per_micro_batch(self, tp: int, pp: int, micro_batch: int, recompute: Recompute
                        ) -> float:
        """One micro-batch's compute on the slowest of ``pp`` stages (see
        ``lower_bound_per_micro_batch``)."""
        key = (tp, micro_batch, recompute)
        parts = self._cache.get(key)
        if parts is None:
            model, train, rate = self.model, self.train, self._rate
            lf, lb, lr = _layer_times_of(model, train.seq_len, train.precision, micro_batch,
                                         tp, recompute, self._flash, self._sp, rate,
                                         self._mem_bps, self._op_sac, self._hf)
            f, _, b, _ = _layer_passes(lf, lb, lr, recompute, 0.0, 0.0, self._floor)
            tokens = micro_batch * train.seq_len
            v_local = model.vocab_size / tp
            gemm = _gemm_s(2.0 * tokens * model.hidden_size * v_local, rate)
            loss = tokens * v_local * self._loss_bytes / self._mem_bps
            parts = self._cache[key] = (f + b, 3.0 * gemm, loss)
        layer, head, loss = parts
        # the head runs on the last stage only, m of the m + pp − 1 schedule steps: m/(m+pp−1)
        # >= 1/pp for every m >= 1, so a pp-th of it per step keeps this a lower bound; the
        # eager Hugging Face weight casts (m per step on the stage, ``StepTimeModel._parts``)
        # likewise
        casts = 0.0
        if self._hf is not None:
            casts = (_hf_cast_bytes(_act_bytes(self.train.precision), recompute)
                     * _stage_params_of(self.model, tp, pp) / self._mem_bps / pp)
        return (self.model.num_layers / pp * layer + self._micro + (head + loss) / pp + casts)


def estimate_step_time(
    model: ModelSpec,
    train: TrainingSpec,
    par: ParallelConfig,
    gpu: GpuType,
    topology: Topology | None = None,
    runtime: str = DEFAULT_RUNTIME,
) -> StepTime:
    """Predict the time of one optimizer step of ``par`` training ``model`` on ``gpu`` under
    the training ``runtime`` ("frenzy", "megatron", "deepspeed" or "fsdp2").

    ``topology`` says how the GPUs are placed; without it the planner's default (full nodes of
    8) is assumed. The plan is not validated here (see ``ParallelConfig.check``); micro-batches
    per replica are ``global_batch / (dp · micro_batch)``, at least one. An explicit uneven
    split of the layers over the pipeline stages goes in ``par.extra["stage_layers"]`` (one
    count per stage, summing to the model's layers).
    """
    topo = topology or default_topology(gpu, par.num_gpus)
    return StepTimeModel(model, train, gpu, topo, runtime=runtime).estimate(par)


def _stage_layers(par: ParallelConfig, num_layers: int) -> tuple[int, ...] | None:
    """The explicit layers per stage of ``par``, checked; None for the even split."""
    raw = par.extra.get("stage_layers")
    if raw is None:
        return None
    split = tuple(int(x) for x in raw)
    if len(split) != par.pp or sum(split) != num_layers or min(split) < 0:
        raise ValueError(
            f"stage_layers must give {par.pp} non-negative counts summing to {num_layers}, "
            f"got {list(split)}")
    return split


class StepTimeModel:
    """``estimate_step_time`` of many plans of one job on one GPU type and placement.

    The planner estimates hundreds of plans per (GPU type, GPU count) that share a layout
    (tp, pp, dp) and differ in micro-batch and memory savers; what depends only on the layout
    (group spans, the data-parallel collectives, the optimizer step) is computed once per
    layout. Each estimate is the same arithmetic as a fresh ``estimate_step_time`` call, so
    the results are identical.
    """

    __slots__ = (
        "_compute",
        "_dp_overlap",
        "_floor",
        "_grad_bytes",
        "_hf",
        "_layouts",
        "_links",
        "_loss_bytes",
        "_mem_bps",
        "_micro",
        "_nbytes",
        "_op_sac",
        "_opt_bytes",
        "_rate",
        "_tp_bwd_wgrad",
        "gpu",
        "model",
        "runtime",
        "topo",
        "train",
    )

    def __init__(self, model: ModelSpec, train: TrainingSpec, gpu: GpuType,
                 topology: Topology, compute_cache: dict | None = None,
                 runtime: str = DEFAULT_RUNTIME) -> None:
        """``compute_cache`` (optional) holds the per-micro-batch compute times, which do not
        depend on the placement: models of the same job, GPU type, precision and runtime
        (differing only in ``topology``) may share one dict."""
        profile = runtime_step_profile(runtime)
        self.model, self.train, self.gpu, self.topo = model, train, gpu, topology
        self.runtime = runtime
        self._op_sac = profile.selective_op_sac
        self._hf, self._loss_bytes = _eager_terms(model, train.precision, runtime)
        self._compute = {} if compute_cache is None else compute_cache
        self._links = _links(gpu, topology)
        self._rate, self._mem_bps = device_rates(gpu, train.precision, runtime)
        self._nbytes = _act_bytes(train.precision)
        self._grad_bytes = 4.0 if train.precision is Precision.FP32 else 2.0
        self._opt_bytes = (profile.optimizer_bytes if train.optimizer.value in ("adam", "adamw")
                           else OPTIMIZER_BYTES.get(train.optimizer.value, 30.0))
        self._dp_overlap = profile.dp_overlap
        self._floor, self._micro = host_overheads(runtime)
        self._tp_bwd_wgrad = profile.tp_bwd_behind_wgrad
        self._layouts: dict[tuple[int, int, int], tuple[float, ...]] = {}

    def _layout(self, t: int, p: int, d: int) -> tuple[float, ...]:
        """(nodes a tp group spans, tp groups per node, pipeline p2p bandwidth, nodes a dp
        group spans, dp groups per node, stage parameters, gradient all-reduce, optimizer
        step without and with ZeRO sharding) of a layout."""
        key = (t, p, d)
        out = self._layouts.get(key)
        if out is not None:
            return out
        topo, links = self.topo, self._links
        g = topo.node_size(t * p * d)
        tp_nodes, pp_nodes, dp_nodes = topo.spans(t, p, d)
        tp_groups = max(1, g // max(1, t // tp_nodes))
        bw = 0.0
        if p > 1:
            if pp_nodes > 1:
                # boundaries crossing nodes share the NIC among the tp·dp ranks of a stage block
                senders = min(g, t * d) if topo.rank_order == "tp-dp-pp" else min(g, t)
                bw = links.inter_gbs / senders
            else:
                bw = links.intra_p2p_gbs
        params = _stage_params_of(self.model, t, p)
        groups_per_node = max(1, g // max(1, d // dp_nodes)) if dp_nodes > 1 else 1
        all_reduce = _group_collective_s(  # = RS + AG for ZeRO-1/2
            params * self._grad_bytes, d, dp_nodes, groups_per_node, links.intra_bus_gbs,
            links.inter_gbs, links.latency_s, 2.0)
        opt_full = self._opt_bytes * params / 1 / self._mem_bps
        opt_shard = self._opt_bytes * params / d / self._mem_bps
        out = self._layouts[key] = (tp_nodes, tp_groups, bw, dp_nodes, groups_per_node,
                                    params, all_reduce, opt_full, opt_shard)
        return out

    def _zero3(self, d: int, dp_nodes: int, groups_per_node: int, params: float
               ) -> tuple[float, float]:
        """ZeRO-3's parameter all-gather and gradient reduce-scatter of a layout."""
        links = self._links
        gather = _group_collective_s(
            params * self._nbytes, d, dp_nodes, groups_per_node, links.intra_bus_gbs,
            links.inter_gbs, links.latency_s, 1.0)
        scatter = _group_collective_s(
            params * self._grad_bytes, d, dp_nodes, groups_per_node, links.intra_bus_gbs,
            links.inter_gbs, links.latency_s, 1.0)
        return gather, scatter

    def estimate(self, par: ParallelConfig) -> StepTime:
        """The step time of ``par`` (see ``estimate_step_time``)."""
        return StepTime(*self._parts(
            par.tp, par.pp, par.dp, par.micro_batch, par.recompute, par.zero_stage,
            par.sequence_parallel, par.flash_attention,
            max(1, int(par.extra.get("virtual_pp", 1))),
            _stage_layers(par, self.model.num_layers)))

    def total_s(self, tp: int, pp: int, dp: int, micro_batch: int, recompute: Recompute,
                zero_stage: int, sequence_parallel: bool, flash_attention: bool) -> float:
        """``estimate(...).total_s`` of a plan given by its knobs (no interleaving), without
        building the ``ParallelConfig`` or the ``StepTime``: what a search compares."""
        return self._parts(tp, pp, dp, micro_batch, recompute, zero_stage,
                           sequence_parallel and tp > 1, flash_attention, 1, None)[6]

    def _parts(self, t: int, p: int, d: int, mb: int, recompute: Recompute, zero: int,
               sp: bool, flash: bool, virtual: int, split: tuple[int, ...] | None
               ) -> tuple[float, float, float, float, float, float, float]:
        """(compute, tp comm, pipeline bubble, pipeline p2p, dp comm, optimizer, total)."""
        model, train, links = self.model, self.train, self._links
        m = max(1, train.global_batch // (d * mb))
        layout = self._layouts.get((t, p, d))
        if layout is None:
            layout = self._layout(t, p, d)
        tp_nodes, tp_groups, bw, dp_nodes, groups_per_node, params, all_reduce, opt_full, \
            opt_shard = layout

        # -- per layer and micro-batch: GPU work and tp collectives under the host floor ----
        act = mb * train.seq_len * model.hidden_size * self._nbytes
        ckey = (t, mb, recompute, sp, flash, tp_nodes, tp_groups)
        per_mb = self._compute.get(ckey)
        if per_mb is None:
            rate, mem_bps = self._rate, self._mem_bps
            lf, lb, lr = _layer_times_of(model, train.seq_len, train.precision, mb, t,
                                         recompute, flash, sp, rate, mem_bps, self._op_sac,
                                         self._hf)
            # 2 all-reduces per layer forward (and per full-recompute re-forward); 2 in the
            # backward, of which the runtime's profile says how much is exposed
            one_ar = _group_collective_s(
                act, t, tp_nodes, tp_groups, links.intra_bus_gbs, links.inter_gbs,
                links.latency_s,
            )
            if self._tp_bwd_wgrad:
                # each of the 2 input-gradient all-reduces (attention QKV, MLP input) runs
                # beside the weight-gradient GEMM of its own layer: what exceeds that GEMM
                tokens = mb * train.seq_len
                h = model.hidden_size
                w_qkv = _gemm_s(2.0 * tokens * h * (model.attn_hidden + 2 * model.kv_hidden)
                                / t, rate)
                w_in = _gemm_s(2.0 * tokens * h * model.ffn_hidden_size
                               * (2 if model.swiglu else 1) / t, rate)
                bwd_ar = max(0.0, one_ar - w_qkv) + max(0.0, one_ar - w_in)
            else:
                bwd_ar = 2.0 * (1.0 - TP_BWD_OVERLAP) * one_ar
            f, cf, b, cb = _layer_passes(lf, lb, lr, recompute, 2.0 * one_ar, bwd_ar,
                                         self._floor)
            # logits GEMM and fp32 cross-entropy on the last stage
            tokens = mb * train.seq_len
            v_local = model.vocab_size / t
            gemm = _gemm_s(2.0 * tokens * model.hidden_size * v_local, rate)
            loss = tokens * v_local * self._loss_bytes / 2 / mem_bps  # forward, as much back
            per_mb = self._compute[ckey] = (f + b, cf + cb, 3.0 * gemm + 2.0 * loss,
                                            b, 2.0 * gemm + loss)
        layer, layer_comm, head, layer_bwd, head_bwd = per_mb

        # -- compute of the slowest stage, per micro-batch ---------------------------------
        # (+ the runtime's own work per micro-batch: its forward/backward calls, loss
        # scaling, the pipeline engine's send/receive bookkeeping; every stage pays it)
        layer_mb = self._micro
        if split is None:
            layers = model.num_layers / p
            slowest = layers * layer + head + layer_mb
            # the other stages' share of the 1F1B fill and drain (they hold no head)
            fill = (p - 1) * (layers * layer + layer_mb)
            comm = layers * layer_comm
            fill_comm = (p - 1) * comm
        else:
            stage = [n * layer + layer_mb + (head if i == p - 1 else 0.0)
                     for i, n in enumerate(split)]
            slow = max(range(p), key=stage.__getitem__)
            layers = float(split[slow])
            slowest = stage[slow]
            fill = sum(stage) - slowest
            comm = layers * layer_comm
            fill_comm = (sum(split) - layers) * layer_comm

        compute_s = m * slowest
        if self._hf is not None:
            # the weight casts of every micro-batch; from the second on it adds into .grad
            cast = _hf_cast_bytes(self._nbytes, recompute)
            compute_s += (m * cast + (m - 1) * 12.0) * params / self._mem_bps
        tp_comm_s = m * comm
        pp_bubble_s = (fill + fill_comm) / virtual if p > 1 else 0.0

        # -- pipeline p2p: Pipette's bubble + hidden critical path ------------------------
        pp_p2p_s = 0.0
        if p > 1:
            msg = act / (t if sp else 1)
            one = links.latency_s + msg / (bw * 1e9)
            pp_p2p_s = max(1.0, m / p) * 2 * (p - 1) * virtual * one

        # -- data parallel ----------------------------------------------------------------
        if zero >= 3:
            # two parameter all-gathers per micro-batch (forward, backward) + grad
            # reduce-scatter; prefetching hides them behind compute except the first
            # layer's gather.
            gather, scatter = self._zero3(d, dp_nodes, groups_per_node, params)
            total_comm = m * 2 * gather + scatter
            dp_comm_s = max(total_comm - compute_s, total_comm / max(1.0, layers))
        elif all_reduce <= 0:
            dp_comm_s = 0.0
        elif self._dp_overlap:
            # bucketed during the last micro-batch's backward: what exceeds that backward,
            # and at least the last layer's bucket, which can only start once it ends
            t_b = layers * layer_bwd + head_bwd
            dp_comm_s = max(all_reduce - t_b, all_reduce / max(1.0, layers))
        else:
            dp_comm_s = all_reduce  # issued after the backward pass

        # -- optimizer step (memory-bound) ------------------------------------------------
        optimizer_s = opt_shard if zero >= 1 else opt_full

        total = compute_s + tp_comm_s + pp_bubble_s + pp_p2p_s + dp_comm_s + optimizer_s
        return compute_s, tp_comm_s, pp_bubble_s, pp_p2p_s, dp_comm_s, optimizer_s, total
