"""Per-runtime and per-GPU calibration of the step-time model.

Two kinds of figures live here, both keyed by plain strings so that other modules (the
memory model's runtime profiles, the GPU catalog) can refer to them without importing this
module's types:

* ``RUNTIME_STEP_PROFILES``: what a training runtime does that changes the step time — whether
  its fp32 matmuls run on TF32 tensor cores, whether it overlaps the data-parallel gradient
  synchronisation with the backward pass, and how many bytes per parameter its optimizer step
  moves. Counted from each framework's code path, not fitted (docs/step_time_accuracy.md).
* ``MATMUL_EFFICIENCY``: the asymptotic fraction of the dense tensor peak that large training
  GEMMs reach, per (GPU type, matmul mode). Entries are calibrated on the CALIBRATION split of
  the shared measurements (``benchmarks/step_time_accuracy.py`` names it); a GPU type or mode
  without an entry falls back to the catalog's a-priori ``matmul_efficiency``.

Pure data and arithmetic: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.errors import SpecError
from predictor.gpus import GpuType
from predictor.spec import Precision

DEFAULT_RUNTIME = "frenzy"


@dataclass(frozen=True, slots=True)
class RuntimeStepProfile:
    """What a training runtime does that the step-time model must know.

    ``fp32_tf32``: fp32 matmuls run on TF32 tensor cores where the GPU has them (PyTorch 1.7 to
    1.11 enabled it by default; Megatron-LM and DeepSpeed set ``allow_tf32``; PyTorch >= 1.12
    needs ``torch.backends.cuda.matmul.allow_tf32 = True`` or ``set_float32_matmul_precision``).
    ``dp_overlap``: the gradient all-reduce (or reduce-scatter) is issued in buckets during the
    backward pass (PyTorch DDP, FSDP); without it the whole synchronisation follows the last
    backward (Megatron-LM before its 2023 ``overlap_grad_reduce``, DeepSpeed's ZeRO-0/1 and
    pipeline engines). ``optimizer_bytes``: HBM bytes per parameter of one optimizer step of
    Adam with fp32 master weights, counted from the runtime's kernels.
    ``layer_overhead_s`` / ``micro_batch_overhead_s``: the runtime's host floor per layer pass
    and its own work per micro-batch and stage, where calibrated for it (None: the step-time
    module's ``LAYER_OVERHEAD_S`` / ``MICRO_BATCH_OVERHEAD_S``). ``tp_bwd_behind_wgrad``: each
    backward tensor-parallel all-reduce of the input gradient runs beside the weight-gradient
    GEMM of its own layer and costs only what outlasts it (Megatron's asynchronous
    all-reduce); otherwise the module's fixed ``TP_BWD_OVERLAP`` fraction is hidden.
    ``selective_op_sac``: its selective recomputation is torchtitan's per-op SAC, whose
    backward re-runs a layer's element-wise work and the matmuls whose outputs the policy
    does not save (``ModelSpec.op_sac_linears``), not Megatron's attention core alone.
    ``eager_hf``: it runs the model's own eager Hugging Face code under autocast over fp32
    weights: the element-wise bytes of a layer, the loss's and the per-micro-batch weight
    casts are counted from that code (``step_time.hf_elementwise_bytes``), not Megatron's.
    """

    name: str
    fp32_tf32: bool
    dp_overlap: bool
    optimizer_bytes: float
    description: str
    layer_overhead_s: float | None = None
    micro_batch_overhead_s: float | None = None
    tp_bwd_behind_wgrad: bool = False
    selective_op_sac: bool = False
    eager_hf: bool = False


# Optimizer bytes per parameter:
# * "frenzy": AdamW on fp32 master weights with half copies, DDP-style bucketed all-reduce
#   of half gradients: read master, grad, m, v (16 B), write master, m, v and the half copy
#   (14 B) = 30. NOTE: this is what the planner has always priced, not what today's built-in
#   trainer does: orchestrator/trainer runs torch.optim.AdamW on fp32 parameters under
#   autocast (28 B) and all-reduces fp32 gradients in one flat buffer after the backward
#   (parallel.allreduce_grads), i.e. dp_overlap=False with 4-byte gradients. Switching the profile
#   to that moves the phoebe golden trace's has average JCT by +35 %, so it waits for the
#   trainer rework (issue 11, item 3) to settle which of the two is true.
# * Megatron-LM / DeepSpeed fp16 optimizer (Float16OptimizerWithFloat16Params, DeepSpeed
#   FP16_Optimizer): copy half grads to fp32 main grads (2 + 4), unscale and inf check (4 + 4),
#   grad-norm read (4), fused Adam (16 + 12), copy main params back to half (4 + 2) = 52.
# * "hf-trainer": torch's foreach AdamW on the fp32 parameters (``_multi_tensor_adam``): weight
#   decay mul_ (r4 w4), lerp_ of m (r4 r4 w4), mul_ of v (r4 w4), addcmul_ (r4 r4 w4), the
#   sqrt temporary (r4 w4), its div_ and add_ eps (r4 w4 each), addcdiv_ into the parameter
#   (r4 r4 r4 w4) = 80, after the Trainer's clip_grad_norm_ (max_grad_norm 1.0 by default:
#   foreach norm r4, foreach mul_ r4 w4) = 92.
# * FSDP/FSDP2 with fp32 sharded parameters: Adam on fp32 params and fp32 reduced grads (16 + 12)
#   plus the grad-norm read (4) = 32; the bf16 cast happens in the all-gather.
# Host terms: only "deepspeed" has its own, calibrated on vTrain single (Megatron-DeepSpeed, the
# calibration split of benchmarks/step_time_accuracy.py): 2.5 ms per micro-batch and stage (least
# MAPE over 1.5-3 ms with the 0.8 ms floor) and the wgrad-bounded backward all-reduces. The other
# profiles keep the module constants, so "frenzy" (the simulator's trace runtime) is unchanged.
RUNTIME_STEP_PROFILES: dict[str, RuntimeStepProfile] = {
    "frenzy": RuntimeStepProfile(
        "frenzy", fp32_tf32=False, dp_overlap=True, optimizer_bytes=30.0,
        description="the built-in trainer as planned: bucketed all-reduce, AdamW"),
    "megatron": RuntimeStepProfile(
        "megatron", fp32_tf32=True, dp_overlap=False, optimizer_bytes=52.0,
        description="Megatron-LM (gradient all-reduce after the backward pass)"),
    "deepspeed": RuntimeStepProfile(
        "deepspeed", fp32_tf32=True, dp_overlap=False, optimizer_bytes=52.0,
        description="DeepSpeed / Megatron-DeepSpeed engine (ZeRO-0/1, pipeline engine)",
        micro_batch_overhead_s=2.5e-3, tp_bwd_behind_wgrad=True),
    "fsdp2": RuntimeStepProfile(
        "fsdp2", fp32_tf32=True, dp_overlap=True, optimizer_bytes=32.0,
        description="PyTorch FSDP/FSDP2 (torchtitan, llm-foundry): overlapped reduce-scatter",
        selective_op_sac=True),
    "hf-trainer": RuntimeStepProfile(
        "hf-trainer", fp32_tf32=False, dp_overlap=True, optimizer_bytes=92.0,
        description="Hugging Face Trainer / Lightning: the model's eager code under autocast "
        "over fp32 weights, foreach AdamW after gradient clipping", eager_hf=True),
}


def runtime_step_profile(runtime: str) -> RuntimeStepProfile:
    """The step-time profile of ``runtime``; a clear error naming the known ones."""
    try:
        return RUNTIME_STEP_PROFILES[runtime]
    except KeyError:
        raise SpecError(
            "runtime",
            f"unknown runtime {runtime!r}; one of {', '.join(RUNTIME_STEP_PROFILES)}",
        ) from None


# (GPU type, matmul mode) -> asymptotic matmul efficiency, calibrated on the CALIBRATION split
# (benchmarks/step_time_accuracy.py, docs/step_time_accuracy.md). Modes: fp16, bf16, tf32, fp32.
# A100 fp16: vTrain single-node (Megatron-DeepSpeed). A100/H100 bf16: llm-foundry MPT rows of
# the calibration sizes (125m, 350m, 1b, 7b, 30b) at the vendor power limit (400 W A100 SXM,
# 700 W H100 SXM), the value of least calibration MAPE on a 0.05 grid per GPU type. Nothing
# here for a part below its vendor power limit: no shared measurement covers one.
MATMUL_EFFICIENCY: dict[tuple[str, str], float] = {
    ("A100-40G", "fp16"): 0.80,
    ("A100-80G", "fp16"): 0.80,
    ("A100-40G", "bf16"): 0.75,
    ("A100-80G", "bf16"): 0.80,
    ("H100-80G", "bf16"): 0.55,
    # the fp16 tensor-core rate of the same part equals its bf16 rate: same figure, assumed
    ("H100-80G", "fp16"): 0.55,
    # the H200 is the H100's die (same SXM power and tensor rates) with more HBM: the H100's
    # calibrated figures carry over, assumed, not fitted on an H200 measurement
    ("H200", "bf16"): 0.55,
    ("H200", "fp16"): 0.55,
    # likewise the H800 (H100 SXM5 compute, a narrower NVLink) and the GH200's Hopper GPU
    # (H100 compute at a module power of up to 1000 W with the Grace CPU): the 700 W H100's
    # calibrated figure, assumed, not fitted on a measurement of theirs (without an entry they
    # fell back to the catalog's a-priori 0.7, the figure the H100's own data refuted)
    ("H800-80G", "bf16"): 0.55,
    ("H800-80G", "fp16"): 0.55,
    ("GH200-96G", "bf16"): 0.55,
    ("GH200-96G", "fp16"): 0.55,
    ("GH200-144G", "bf16"): 0.55,
    ("GH200-144G", "fp16"): 0.55,
    # the H100 96GB at Grand Teton's 500 W power limit (torchtitan's H100 runs): 0.50, the
    # least error on the calibration row (Llama 3.1 8B on 8 GPUs; 0.45 / 0.55 give +8.3 /
    # -8.6 %); the 128-GPU row is validation (-4.0 %). Below the 700 W part's 0.55.
    ("H100-96G", "bf16"): 0.50,
    ("H100-96G", "fp16"): 0.50,
}


def tf32_tflops(gpu: GpuType) -> float | None:
    """Dense TF32 tensor TFLOP/s: half the dense FP16 rate on every part with TF32 (Ampere and
    later, the parts with bf16 tensor cores: A100 156 of 312, H100 SXM 494.5 of 989, A10 62.5
    of 125, L40S 181 of 362); None before Ampere."""
    return gpu.fp16_tflops / 2.0 if gpu.bf16_tflops else None


def matmul_mode(gpu: GpuType, precision: Precision, runtime: str = DEFAULT_RUNTIME) -> str:
    """Which tensor-core mode the matmuls of ``precision`` run in under ``runtime``."""
    if precision is Precision.FP16:
        return "fp16"
    if precision is Precision.BF16:
        return "bf16" if gpu.bf16_tflops else "fp32"
    if runtime_step_profile(runtime).fp32_tf32 and tf32_tflops(gpu):
        return "tf32"
    return "fp32"


def matmul_rate(gpu: GpuType, precision: Precision, runtime: str = DEFAULT_RUNTIME) -> float:
    """Asymptotic matmul FLOP/s of ``gpu`` for ``precision`` under ``runtime``: the mode's dense
    peak times its calibrated (or catalog) efficiency."""
    mode = matmul_mode(gpu, precision, runtime)
    peak = tf32_tflops(gpu) if mode == "tf32" else gpu.peak_tflops(precision)
    eff = MATMUL_EFFICIENCY.get((gpu.name, mode), gpu.matmul_efficiency)
    return float(peak) * 1e12 * eff
