"""Turn measured step-time rows into predictor inputs and score predictions against them.

Pure: callers read the CSV files (``benchmarks/step_time_accuracy.py``) and pass rows as
dicts of strings; this module builds ``Case`` values (model, training, plan, GPU, topology,
measured seconds) and computes error statistics. Each builder documents how it reads its data
set — which model dimensions, precision, recompute and network it assumes — because most
sources give only part of that and the reading is part of the validation's honesty.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from predictor.gpus import GpuType
from predictor.spec import Family, ModelSpec, ParallelConfig, Precision, Recompute, TrainingSpec
from predictor.step_time import StepTime, Topology, estimate_step_time

Row = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Case:
    """One measured step: everything the model needs, and the measured seconds."""

    dataset: str
    label: str
    model: ModelSpec
    train: TrainingSpec
    par: ParallelConfig
    gpu: str
    topology: Topology
    measured_s: float
    group: str = ""  # sub-set for reporting (e.g. GPU type, "extrapolated")
    runtime: str = "frenzy"  # the training runtime whose step-time profile applies


@dataclass(frozen=True, slots=True)
class ErrorStats:
    n: int
    mape: float  # mean |pred − meas| / meas, percent
    worst: float  # largest |pred − meas| / meas, percent
    median_ratio: float  # median pred / meas

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "mape": self.mape, "worst": self.worst,
                "median_ratio": self.median_ratio}


def error_stats(predicted: Sequence[float], measured: Sequence[float]) -> ErrorStats:
    """MAPE, worst case and median ratio of paired predictions and measurements."""
    if len(predicted) != len(measured) or not measured:
        raise ValueError("need equally many predictions and measurements, at least one")
    errs = [abs(p - m) / m * 100.0 for p, m in zip(predicted, measured, strict=True)]
    ratios = [p / m for p, m in zip(predicted, measured, strict=True)]
    return ErrorStats(len(errs), statistics.fmean(errs), max(errs), statistics.median(ratios))


def predict(case: Case, gpus: Mapping[str, GpuType]) -> StepTime:
    return estimate_step_time(case.model, case.train, case.par, gpus[case.gpu], case.topology,
                              case.runtime)


def score(
    cases: Iterable[Case],
    gpus: Mapping[str, GpuType],
    key: Callable[[Case], str] = lambda c: c.dataset,
) -> dict[str, ErrorStats]:
    """Error statistics per ``key`` (default: per data set)."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for case in cases:
        pred, meas = groups.setdefault(key(case), ([], []))
        pred.append(predict(case, gpus).total_s)
        meas.append(case.measured_s)
    return {k: error_stats(p, m) for k, (p, m) in groups.items()}


def _megatron_vocab(tp: int, vocab: int = 50257) -> int:
    """Megatron pads the vocabulary to a multiple of 128·tp."""
    mult = 128 * tp
    return -(-vocab // mult) * mult


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int,
         ffn: int = 0) -> ModelSpec:
    return ModelSpec(name, Family.GPT2, layers, hidden, heads, vocab_size=vocab,
                     max_seq_len=seq, ffn_hidden_size=ffn)


def _field(row: Row, *names: str) -> str:
    for name in names:
        if name in row:
            return row[name]
        for key in row:  # tolerate a BOM or stray spaces in headers
            if key.strip().lstrip("\ufeff") == name:
                return row[key]
    raise KeyError(names[0])


# --- vTrain (Megatron-DeepSpeed, A100, activation checkpointing) --------------------------
# Reading: fp16, full recomputation (use_checkpoint=true), 1F1B, no flash attention, no
# sequence parallelism, ZeRO off, GPT-2 vocabulary padded to 128·tp, tied embeddings. The
# A100's memory size is not stated; the 40 GB part is assumed (its HBM bandwidth is the lower
# one, which only touches element-wise and optimizer terms). Network: vTrain's validation
# config (800 Gb/s per node = 100 GB/s), NVLink inside the 8-GPU node.
VTRAIN_INTER_BW_GBS = 100.0


def vtrain_cases(rows: Iterable[Row], dataset: str) -> list[Case]:
    cases = []
    for row in rows:
        n = int(_field(row, "# GPUs"))
        h = int(_field(row, "hidden size"))
        a = int(_field(row, "attention heads"))
        layers = int(_field(row, "# layers"))
        s = int(_field(row, "sequence length"))
        tp = int(_field(row, "tensor parallelism"))
        dp = int(_field(row, "data parallelism"))
        pp = int(_field(row, "pipeline parallelism"))
        mb = int(_field(row, "micro batch"))
        gb = int(_field(row, "global batch"))
        model = _gpt(f"gpt-h{h}-l{layers}", layers, h, a, s, _megatron_vocab(tp))
        train = TrainingSpec(global_batch=gb, seq_len=s, precision=Precision.FP16,
                             flash_attention=False, sequence_parallel=False)
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=mb, recompute=Recompute.FULL,
                             flash_attention=False)
        topo = Topology(num_nodes=max(1, math.ceil(n / 8)), inter_bw_gbs=VTRAIN_INTER_BW_GBS)
        cases.append(Case(dataset, f"h{h} L{layers} t{tp}d{dp}p{pp} mb{mb} gb{gb}", model,
                          train, par, "A100-40G", topo,
                          float(_field(row, "iteration time (ms)")) / 1e3,
                          runtime="deepspeed"))
    return cases


# --- Korthikanti et al. 2022, Table 5 (Selene, A100-80G) ----------------------------------
# Reading: "full_recompute" = full recomputation without sequence parallelism; "seq+sel" =
# sequence parallelism + selective recomputation. No flash attention (2022 Megatron), virtual
# pipeline chunks from the table, bf16/fp16 (2-byte activations). Selene: 8×200 Gb/s HDR per
# node = 200 GB/s.
SELENE_INTER_BW_GBS = 200.0


def korthikanti_cases(rows: Iterable[Row]) -> list[Case]:
    cases = []
    for row in rows:
        tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
        s = int(row["seq_len"])
        model = _gpt(row["model"], int(row["layers"]), int(row["hidden"]), int(row["heads"]),
                     s, int(row["vocab"]), ffn=int(row["ffn"]))
        seqsel = row["mode"] == "seq+sel"
        train = TrainingSpec(global_batch=int(row["global_batch"]), seq_len=s,
                             precision=Precision.BF16, flash_attention=False,
                             sequence_parallel=seqsel)
        par = ParallelConfig(
            tp=tp, pp=pp, dp=dp, micro_batch=int(row["micro_batch"]),
            recompute=Recompute.SELECTIVE if seqsel else Recompute.FULL,
            sequence_parallel=seqsel, flash_attention=False,
            extra={"virtual_pp": int(row["virtual_pp"] or 1)},
        )
        n = tp * pp * dp
        topo = Topology(num_nodes=max(1, math.ceil(n / 8)), inter_bw_gbs=SELENE_INTER_BW_GBS)
        cases.append(Case("korthikanti", f"{row['model']} {row['mode']}", model, train, par,
                          "A100-80G", topo, float(row["iteration_time_s"]),
                          runtime="megatron"))
    return cases


# --- Megatron papers (paper-reported iteration times only) --------------------------------
def megatron_paper_cases(rows: Iterable[Row]) -> list[Case]:
    """Rows with a reported iteration time (others give only TFLOP/s without a batch). The
    runtime profile is the row's ``framework``: Megatron-DeepSpeed (MT-NLG) is ``deepspeed``,
    Megatron-LM is ``megatron``."""
    cases = []
    for row in rows:
        if not row.get("iteration_time_s") or not row.get("global_batch"):
            continue
        tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
        s = int(row["seq_len"])
        h = int(row["hidden"])
        model = _gpt(row["model"], int(row["layers"]), h, int(row["heads"]), s,
                     _megatron_vocab(tp))
        train = TrainingSpec(global_batch=int(row["global_batch"]), seq_len=s,
                             precision=Precision.FP16, flash_attention=False,
                             sequence_parallel=False)
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=int(row["micro_batch"]),
                             recompute=Recompute.FULL, flash_attention=False)
        topo = Topology(num_nodes=max(1, math.ceil(tp * pp * dp / 8)),
                        inter_bw_gbs=SELENE_INTER_BW_GBS)
        cases.append(Case("megatron_papers", f"{row['source']} {row['model']}", model, train,
                          par, "A100-80G", topo, float(row["iteration_time_s"]),
                          runtime="deepspeed" if "deepspeed" in row.get("framework", "").lower()
                          else "megatron"))
    return cases


# --- llm-foundry MPT (Composer + FSDP, flash attention) -----------------------------------
# MPT shapes (llm-foundry yamls/pretrain/mpt-*.yaml): (layers, hidden, heads); ffn = 4·h,
# vocab 50368, tied embeddings. FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2. Network: the
# A100 sections state 1600 Gb/s RoCE (200 GB/s per node); the H100 sections do not, 3200 Gb/s
# (400 GB/s, the usual H100 HGX fabric) is assumed. FP8 rows are skipped (no FP8 model).
MPT_SHAPES = {
    "125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12),
    "1b": (24, 2048, 16), "3b": (32, 2560, 20), "7b": (32, 4096, 32),
    "13b": (40, 5120, 40), "30b": (48, 7168, 56), "70b": (80, 8192, 64),
}
FOUNDRY_GPU = {"h100_80gb": ("H100-80G", 400.0), "a100_80gb": ("A100-80G", 200.0),
               "a100_40gb": ("A100-40G", 200.0)}


def llm_foundry_cases(rows: Iterable[Row]) -> list[Case]:
    cases = []
    for row in rows:
        if "fp8" in row["Precision"] or row["GPU"] not in FOUNDRY_GPU:
            continue
        shape = MPT_SHAPES.get(row["Model"])
        if shape is None:
            continue
        layers, h, a = shape
        s = int(row["SeqLen (T)"])
        n = int(row["# GPUs"])
        mb = int(row["MicroBatchSize"])
        gb = int(row["GlobalBatchSize"])
        model = _gpt(f"mpt-{row['Model']}", layers, h, a, s, 50368)
        train = TrainingSpec(global_batch=gb, seq_len=s, precision=Precision.BF16,
                             flash_attention=True, sequence_parallel=False)
        zero = 3 if row["Sharding Strategy"] == "FULL_SHARD" else 2
        ckpt = row["Activation Checkpointing"] == "True"
        par = ParallelConfig(dp=n, micro_batch=mb, zero_stage=zero,
                             recompute=Recompute.FULL if ckpt else Recompute.NONE)
        gpu, inter = FOUNDRY_GPU[row["GPU"]]
        topo = Topology(num_nodes=max(1, math.ceil(n / 8)), inter_bw_gbs=inter)
        cases.append(Case("llm_foundry", f"mpt-{row['Model']} s{s} n{n} mb{mb}", model, train,
                          par, gpu, topo, float(row["derived_step_time_s"]), group=gpu,
                          runtime="fsdp2"))
    return cases


# torchtitan (benchmarks/data/step_time/torchtitan_tps.csv): Llama 3.1 8B under FSDP2 with
# per-op selective checkpointing (torchtitan's llama3_8b.toml: seq 8192, SDPA flash, bf16
# parameters, fp32 reduction) on Meta's Grand Teton H100 96GB at 500 W, 8 GPUs per host,
# 400 Gb/s per GPU between hosts (3200 Gb/s = 400 GB/s per node). One micro-batch per step.
TORCHTITAN_MODEL = ModelSpec("llama-3.1-8b", Family.LLAMA, 32, 4096, 32, vocab_size=128256,
                             max_seq_len=8192, num_kv_heads=8, ffn_hidden_size=14336,
                             tie_embeddings=False)


def torchtitan_cases(rows: Iterable[Row]) -> list[Case]:
    """The eager rows (no torch.compile, no Float8) as step-time cases."""
    cases = []
    for row in rows:
        if row["technique"] != "eager":
            continue
        s, b, n = int(row["seq_len"]), int(row["local_batch"]), int(row["gpus"])
        train = TrainingSpec(global_batch=b * n, seq_len=s, precision=Precision.BF16,
                             flash_attention=True, sequence_parallel=False)
        par = ParallelConfig(dp=n, micro_batch=b, zero_stage=3,
                             recompute=Recompute.SELECTIVE)
        topo = Topology(num_nodes=max(1, math.ceil(n / 8)), inter_bw_gbs=400.0)
        cases.append(Case("torchtitan", f"llama-3.1-8b s{s} n{n} mb{b}", TORCHTITAN_MODEL,
                          train, par, "H100-96G", topo, b * s / float(row["tps_per_gpu"]),
                          group="H100-96G", runtime="fsdp2"))
    return cases


# --- Sia gpt_pmp (2.8B GPT, pipeline model parallelism) -----------------------------------
# Reading (sia-simulator/applications.py, PMPApplication): each placement row profiles one
# pipeline-parallel job; ``step_time`` is the forward time of ONE stage for ONE micro-batch of
# ``local_bsz`` sequences and the simulator composes the step as
# 3·((p − 1) + 48)·step_time + sync_time, i.e. 1F1B with backward = 2× forward, 48
# micro-batches per optimizer step, p = 8 stages on "rtx" (one 8×2080Ti node per pipeline)
# and p = 2 on "dgx-ext"; ``sync_time`` is the gradient synchronisation across pipeline
# replicas (dp = GPUs / p, data parallelism across nodes, pipelines inside a node).
# Model: GPT-3 "2.7B" shape (32 layers, h 2560, 32 heads, untied output → 2.78B ≈ "2.8B"),
# sequence length 1024 assumed (not stated), fp16 mixed precision, no recomputation,
# no flash attention. The network of Sia's testbed is not stated: the 100 Gb/s default.
# Sia profiled up to 24 rtx GPUs (3 nodes) and 16 dgx GPUs (2 nodes)
# (SiaJobClass.MAX_PROFILED_GPUS); rows beyond are linear extrapolations and are grouped apart.
GPT_PMP_STAGES = {"rtx": 8, "dgx-ext": 2}
GPT_PMP_GPU = {"rtx": "RTX2080Ti", "dgx-ext": "A100-40G"}
GPT_PMP_MAX_PROFILED_NODES = {"rtx": 3, "dgx-ext": 2}
GPT_PMP_MICRO_BATCHES = 48
GPT_PMP_MODEL = ModelSpec("gpt-2.8b", Family.GPT2, 32, 2560, 32, vocab_size=50257,
                          max_seq_len=1024, tie_embeddings=False)
GPT_PMP_SEQ = 1024
# Sia does not say which training code produced gpt_pmp. Read with the built-in trainer's
# profile (plain PyTorch: fp32 matmuls without TF32, the default since PyTorch 1.12); with
# TF32 (the "deepspeed" profile) the A100 rows are predicted at 0.3x (docs).
GPT_PMP_RUNTIME = "frenzy"


def gpt_pmp_measured_step(row: Row, stages: int) -> float:
    """Sia's composed step time of one placement row (seconds)."""
    fwd = float(row["step_time"])
    return 3.0 * ((stages - 1) + GPT_PMP_MICRO_BATCHES) * fwd + float(row["sync_time"])


def gpt_pmp_cases(
    rows: Iterable[Row], cluster: str, precision: Precision = Precision.FP32
) -> list[Case]:
    p = GPT_PMP_STAGES[cluster]
    cases = []
    for row in rows:
        placement = tuple(int(c) for c in row["placement"].strip())
        gpus = sum(placement)
        dp = max(1, gpus // p)
        mb = int(row["local_bsz"])
        train = TrainingSpec(global_batch=dp * mb * GPT_PMP_MICRO_BATCHES, seq_len=GPT_PMP_SEQ,
                             precision=precision, flash_attention=False,
                             sequence_parallel=False)
        par = ParallelConfig(pp=p, dp=dp, micro_batch=mb, flash_attention=False)
        topo = Topology(num_nodes=len(placement), gpus_per_node=placement,
                        rank_order="tp-pp-dp")
        extrapolated = len(placement) > GPT_PMP_MAX_PROFILED_NODES[cluster]
        group = f"{cluster}{' extrapolated' if extrapolated else ''}"
        cases.append(Case(f"gpt_pmp_{cluster}", f"{row['placement']} bsz{mb}", GPT_PMP_MODEL,
                          train, par, GPT_PMP_GPU[cluster], topo,
                          gpt_pmp_measured_step(row, p), group=group,
                          runtime=GPT_PMP_RUNTIME))
    return cases


def gpt_pmp_forward_per_stage(case: Case, gpus: Mapping[str, GpuType]) -> float:
    """The model's forward time of one stage for one micro-batch (the trace's step_time),
    without the pipeline and communication terms, to compare the compute shape alone."""
    st = predict(case, gpus)
    m = max(1, case.par.micro_batches(case.train.global_batch))
    return st.compute_s / m / 3.0


# --- AMP (DeepSpeed + Megatron-LM v1.1.5 3D parallelism, 16 T4 on 4 g4dn.12xlarge) --------
# Reading: GPT-2-medium-like (h 1024, 24 layers, 16 heads, s 1024, vocab 52256, tied), no
# recomputation, no flash attention, ZeRO off; DeepSpeed's pipeline engine with the measured
# uneven ``layer_partition`` (boundaries over the 30 pipeline "layers" of AMP's own profile,
# amp_profiled_layer_fwd_time.csv: embedding, transpose, 24 transformer layers at indices
# 2..25, transpose, final layer norm, tied head, loss). Precision: fp16 mixed, as the source
# says. The data fit no single reading: AMP's profiled transformer layer forward on a T4
# (mb 1, 30.1 GFLOP) takes 4.9-5.8 ms (5.2-6.1 TFLOP/s, 8-9 % of the fp16 tensor peak), while
# its logits GEMM (110 GFLOP) takes 3.1 ms (35 TFLOP/s, 55 %): the layers are bound by work
# the model does not count (likely Megatron-LM v1.1.5's unfused fp32 softmax on the T4's
# 320 GB/s), so this set is reported, not calibrated. Ranks are laid out tp innermost,
# then data, then pipe (DeepSpeed's PipeModelDataParallelTopology): "tp-dp-pp". Network: the
# AMP code's 50 Gb/s (6.25 GB/s) between nodes; the T4s inside a node talk over PCIe.
# Only the homogeneous T4 experiment is a step-time set (het_cluster mixes V100 and T4 in
# one pipeline, het_model is a TransGAN); all experiments' OOM labels feed the memory check.
AMP_MODEL = ModelSpec("gpt2-medium-amp", Family.GPT2, 24, 1024, 16, vocab_size=52256,
                      max_seq_len=1024)
AMP_SEQ = 1024
AMP_FIRST_LAYER = 2  # DeepSpeed pipeline index of the first transformer layer
AMP_INTER_BW_GBS = 6.25
AMP_PRECISION = Precision.FP16


def amp_stage_layers(partition: str, num_layers: int = 24) -> tuple[int, ...]:
    """Transformer layers per stage from AMP's DeepSpeed ``layer_partition`` boundaries."""
    bounds = [int(x) for x in partition.split(",")]
    lo, hi = AMP_FIRST_LAYER, AMP_FIRST_LAYER + num_layers
    return tuple(max(0, min(b, hi) - max(a, lo)) for a, b in itertools.pairwise(bounds))


def amp_plan(row: Row) -> tuple[TrainingSpec, ParallelConfig, Topology]:
    """The training spec, plan and topology of one AMP trial row (any outcome)."""
    tp, dp, pp = int(row["tp"]), int(row["dp"]), int(row["pp"])
    train = TrainingSpec(global_batch=int(row["global_batch"]), seq_len=AMP_SEQ,
                         precision=AMP_PRECISION, flash_attention=False,
                         sequence_parallel=False)
    extra = {"stage_layers": amp_stage_layers(row["layer_partition"])} if pp > 1 else {}
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=int(row["micro_batch"]),
                         flash_attention=False, extra=extra)
    topo = Topology(num_nodes=4, gpus_per_node=(4, 4, 4, 4), inter_bw_gbs=AMP_INTER_BW_GBS)
    return train, par, topo


def amp_cases(rows: Iterable[Row]) -> list[Case]:
    """Step-time cases of the homogeneous T4 experiment's runs that ran."""
    cases = []
    for row in rows:
        if row["experiment"] != "homogeneous" or not row["measured_iter_time_s"]:
            continue
        train, par, topo = amp_plan(row)
        label = f"t{par.tp}d{par.dp}p{par.pp} mb{par.micro_batch}"
        cases.append(Case("amp_t4", label, AMP_MODEL, train, par, "T4", topo,
                          float(row["measured_iter_time_s"]), runtime="deepspeed"))
    return cases
