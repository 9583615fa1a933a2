"""The public real-GPU peak-memory rows (``../shared/measurements/real_memory``) as
``frenzy memory`` specs.

Each CSV row becomes one spec object (``predictor.memory_spec``) with the row's own runtime
profile, the stage the figure was read on, and the measured quantity (``tensors`` for
``max_memory_allocated`` / active peaks, ``reserved`` for ``max_memory_reserved``,
``device`` for nvidia-smi). Context parallelism is expressed as its per-rank share (s/cp
tokens, optimizer shards over dp·cp). Rows the model cannot express (fp8) are kept with the
reason they are skipped. Rows that use a memory technique priced from its library's code but
never calibrated (8-bit and factored optimizers, torchtune's compile / chunked loss /
optimizer-in-backward / activation offload) carry the tag ``flags``: they are predicted and
graded like every other row, but no fitted constant (the allocator slack, the planner's
margin) is taken from them. The many
near-identical Megatron CI toy rows are deduplicated: rows with the same spec (and, for
reserved / nvidia-smi figures, the same GPU) become one row whose measured figure is their
median (the spread is reported).
"""

from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from predictor.memory_spec import estimate_request, parse_memory_spec
from predictor.overhead import NON_TENSOR, NonTensorModel

ROOT = Path(__file__).resolve().parent.parent
DATA_DIRS = (ROOT.parent / "shared" / "measurements" / "real_memory",
             ROOT.parent.parent / "shared" / "measurements" / "real_memory",
             Path("/work/shared/measurements/real_memory"))
LOCAL_DIR = ROOT / "benchmarks" / "data" / "real_memory"
"""Sources kept in the repository (same CSV columns; ``LOCAL_DIR / "SOURCE.md"``)."""
GIB = 1 << 30

GPU_NAMES = (  # CSV gpu column prefix -> catalog name
    ("A100-SXM4-80GB", "A100-80G"), ("A100 (80GB", "A100-80G"), ("A100 40GB", "A100-40G"),
    ("H100-SXM5", "H100-80G"), ("GB200", "GB200"), ("H800", "H800-80G"),
    ("Tesla V100-SXM2-16GB", "V100-16G"), ("H100 96GB", "H100-96G"),
)


@dataclass
class RealRow:
    """One (deduplicated) measured row and the spec that predicts it."""

    source: str  # the CSV's stem
    row_id: str
    spec: dict[str, Any] | None
    quantity: str  # tensors | reserved | device
    measured_bytes: int
    skip: str = ""  # why the row is not used
    duplicates: int = 1
    spread_pct: float = 0.0  # (max - min) / median of the merged rows
    ids: list[str] = field(default_factory=list)
    tags: tuple[str, ...] = ()


def data_dir() -> Path:
    for d in DATA_DIRS:
        if d.is_dir():
            return d
    raise FileNotFoundError("real_memory data not found in " + ", ".join(map(str, DATA_DIRS)))


def _gpu(cell: str) -> str:
    for prefix, name in GPU_NAMES:
        if cell.startswith(prefix):
            return name
    raise ValueError(f"unknown GPU {cell!r}")


def _flags(notes: str) -> dict[str, str]:
    return {k: v.strip() for k, v in re.findall(r"([a-z][a-z0-9-]+)=([^;]*)", notes)}


def _base(r: dict[str, str]) -> dict[str, Any]:
    return dict(global_batch=int(r["global_batch"]) if r["global_batch"] else None,
                seq_len=int(r["seq_len"]), micro_batch=int(r["micro_batch"]), tp=int(r["tp"]),
                pp=int(r["pp"]), dp=int(r["dp"]), gpu=_gpu(r["gpu"]))


def _megatron(r: dict[str, str]) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    f = _flags(r["notes"])
    if "fp8" in r["precision"]:
        return None, ("fp8 training (not modelled: the fp8 copies Transformer Engine keeps of "
                      "each weight and saved GEMM input, row-wise and, on Hopper but not "
                      "Blackwell, a column-wise transpose, depend on the GPU and the "
                      "container's TE version; --tp-comm-overlap's userbuffers are not "
                      "derivable from the row)"), ()
    fsdp = "megatron-fsdp" in r["zero_stage_or_fsdp"]
    if fsdp and "optim_grads_params" not in r["zero_stage_or_fsdp"]:
        return None, "Megatron-FSDP other than optim_grads_params (not modelled)", ()
    L, h = int(r["num_layers"]), int(r["hidden_size"])
    toy = L <= 12 and h <= 512
    model = dict(name=r["model"][:40], family="gpt2", num_layers=L, hidden_size=h,
                 num_heads=int(r["num_heads"]), num_kv_heads=int(r["num_kv_heads"]),
                 ffn_hidden_size=int(r["ffn_hidden_size"]), vocab_size=int(r["vocab_size"]),
                 max_seq_len=int(r["seq_len"]),
                 tie_embeddings=f.get("untie-embeddings-and-output-weights") != "True")
    if f.get("swiglu") == "True":
        model["activation"] = "swiglu"
    spec = _base(r)
    spec.update(model=model, precision="fp16" if r["precision"] == "fp16" else "bf16",
                optimizer="adam", runtime="megatron",
                zero_stage=1 if "distributed optimizer" in r["zero_stage_or_fsdp"] else 0,
                recompute="full" if r["recompute"].startswith("full") else "none",
                flash_attention=r["flash_attention"].startswith("transformer_engine")
                and "unfused" not in r["flash_attention"],
                sequence_parallel=f.get("sequence-parallel") == "True", stage="last")
    cp = int(f.get("cp", "1"))
    if cp > 1:  # the spec's cp: its per-rank share (predictor.memory_spec)
        if spec["seq_len"] % cp:
            return None, "context parallelism with a sequence cp does not divide", ()
        spec["cp"] = cp
    options: dict[str, Any] = {}
    if fsdp:  # Megatron-FSDP's ZeRO-3 (predictor.runtimes: sharding)
        spec["zero_stage"] = 3
        options["sharding"] = "megatron_fsdp"
    if options:
        spec["runtime_options"] = options
    pp = spec["pp"]
    if "num-layers-per-virtual-pipeline-stage" in f:
        spec["virtual_stages"] = L // (pp * int(f["num-layers-per-virtual-pipeline-stage"]))
    if "num-virtual-stages-per-pipeline-rank" in f:
        spec["virtual_stages"] = int(f["num-virtual-stages-per-pipeline-rank"])
    if "decoder-first-pipeline-num-layers" in f:
        a, b = int(f["decoder-first-pipeline-num-layers"]), int(
            f.get("decoder-last-pipeline-num-layers", 0))
        mid = (L - a - b) // (pp - 2) if pp > 2 else 0
        spec["layers_per_stage"] = [a] + [mid] * (pp - 2) + [b]
    for what in ("embedding", "loss"):  # Megatron's split rule (predictor.memory_spec)
        if f.get(f"account-for-{what}-in-pipeline-split") == "True":
            spec[f"account_for_{what}_in_pipeline_split"] = True
    if spec["global_batch"] is None:
        return None, "global batch unknown", ()
    if spec.get("virtual_stages", 1) > 1 and spec.get("layers_per_stage"):
        return None, "virtual pipeline with decoder-first/last stage layers (not modelled)", ()
    tags = ("megatron-toy",) if toy else ("megatron-7b",)
    return spec, "", tags


TORCHTUNE_FLAGS = ("packed", "compile", "chunked_ce", "act_ckpt", "opt_in_bwd", "act_offload",
                   "adamw8bit")
"""The README's "Optimization flags" rows, cumulative top to bottom (SOURCE.md)."""


def _torchtune(r: dict[str, str]) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    flag = r["source_id"].rsplit(":", 1)[1]
    on = set(TORCHTUNE_FLAGS[:TORCHTUNE_FLAGS.index(flag) + 1])
    spec = _base(r)
    spec.update(model=dict(name="llama-3.2-3b", family="llama", num_layers=28, hidden_size=3072,
                           num_heads=24, num_kv_heads=8, ffn_hidden_size=8192,
                           vocab_size=128256, max_seq_len=4096, tie_embeddings=True),
                precision="bf16", optimizer="adamw", runtime="torchtune",
                recompute="full" if r["recompute"].startswith("full") else "none",
                flash_attention=True, zero_stage=0, stage="last")
    options: dict[str, Any] = {}
    if "compile" in on:
        options["compiled"] = True
    if "chunked_ce" in on:
        options["loss_chunks"] = 8  # CEWithChunkedOutputLoss(num_output_chunks=8)
    if "opt_in_bwd" in on:
        options["optimizer_in_backward"] = True
    if "act_offload" in on:
        options["activation_offload"] = True
    if "adamw8bit" in on:
        # The README says "8-bit AdamW"; SOURCE.md infers the recipe default
        # PagedAdamW8bit. Paged states are outside PyTorch's allocator (bitsandbytes
        # ``get_paged``: a CPU tensor over cudaMallocManaged memory), so the active peak
        # could not then exceed the previous row's less its 12 GiB of AdamW states (about
        # 10 GiB); it reads 17.6. Read as a non-paged 8-bit AdamW (bitsandbytes AdamW8bit;
        # torchao's AdamW8bit keeps the same 2 bytes per parameter): docs/memory_accuracy.md
        spec["optimizer"] = "adamw8bit"
    if options:
        spec["runtime_options"] = options
    tags = (UNCALIBRATED,) if flag != "packed" else ()
    return spec, "", tags


def _hf_docs(r: dict[str, str]) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    optimizer, tags = "adamw", ()
    if "Adafactor" in r["optimizer"]:  # transformers Adafactor, as the Trainer builds it
        optimizer, tags = "adafactor", (UNCALIBRATED,)
    elif "Adam8bit" in r["optimizer"]:  # bitsandbytes.optim.Adam8bit (not paged)
        optimizer, tags = "adam8bit", (UNCALIBRATED,)
    spec = _base(r)
    spec.update(model="bert-large", precision="fp32" if r["precision"] == "fp32" else "fp16",
                optimizer=optimizer, runtime="hf-trainer",
                recompute="full" if r["recompute"].startswith("full") else "none",
                flash_attention=False, zero_stage=0, stage="last",
                runtime_options={"classification_head": True,
                                 "optimizer_foreach": False,  # adamw_hf: a per-tensor loop
                                 # torch ~1.10 (January 2022): zero_grad() kept the
                                 # gradients, zeroed (set_to_none became the default in 2.0)
                                 "grads_set_to_none": False})
    return spec, "", tags


def _untied_model(r: dict[str, str], family: str) -> dict[str, Any]:
    """The model object of a row that gives its dimensions (untied output layer)."""
    return dict(name=r["model"][:30], family=family,
                num_layers=int(r["num_layers"]), hidden_size=int(r["hidden_size"]),
                num_heads=int(r["num_heads"]), num_kv_heads=int(r["num_kv_heads"]),
                ffn_hidden_size=int(r["ffn_hidden_size"]), vocab_size=int(r["vocab_size"]),
                max_seq_len=int(r["seq_len"]), tie_embeddings=False)


def _ms_swift(r: dict[str, str]) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    spec = _base(r)
    spec.update(model=_untied_model(r, "qwen2"),
                precision="bf16", optimizer="adamw", runtime="hf-trainer", recompute="full",
                flash_attention=True, zero_stage=0, dropout=0.0, stage="last",
                runtime_options={"pure_low_precision": True})
    return spec, "", ()


def _colossalchat(r: dict[str, str]) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    spec = _base(r)
    spec["global_batch"] = spec["micro_batch"] * spec["dp"]  # accumulation 1 (the script's)
    spec.update(model="llama-2-7b", precision="bf16", optimizer="adamw", runtime="colossalai",
                recompute="full", flash_attention=True, zero_stage=2, dropout=0.0,
                stage="last")
    if "cpu" in r["source_id"]:
        spec["runtime_options"] = {"optimizer_offload": True}
    return spec, "", ()


def _colossal_lightning(r: dict[str, str]
                        ) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    spec = _base(r)
    strategy = r["source_id"].rsplit(":", 1)[1]
    runtime, zero = {"ddp_amp": ("hf-trainer", 0), "deepspeed_zero3": ("deepspeed", 3),
                     "colossalai_gemini_cuda": ("colossalai", 3)}[strategy]
    spec.update(model=dict(name="gpt2-xl-shaped", family="gpt2", num_layers=48,
                           hidden_size=1600, num_heads=25, vocab_size=50257,
                           max_seq_len=1024, tie_embeddings=True),
                precision="fp16", optimizer="adam", runtime=runtime, recompute="full",
                flash_attention=False, zero_stage=zero, stage="last")
    if strategy == "deepspeed_zero3":  # Lightning's DeepSpeedStrategy defaults
        spec["runtime_options"] = {"reduce_bucket_elems": 200_000_000, "overlap_comm": True}
    if strategy == "ddp_amp":  # torch 1.12-era Adam: per-tensor loop (foreach off by default)
        # and zero_grad() keeping the gradients, zeroed (set_to_none became the default in 2.0)
        spec["runtime_options"] = {"optimizer_foreach": False, "grads_set_to_none": False}
    if strategy == "colossalai_gemini_cuda":  # Gemini runs the model in fp16, no autocast
        spec["runtime_options"] = {"logits_fwd_bytes": 6, "logits_bwd_bytes": 6}
    return spec, "", ()


def _torchtitan(r: dict[str, str]) -> tuple[dict[str, Any] | None, str, tuple[str, ...]]:
    if "technique=" in r["notes"]:
        return None, ("torch.compile / Float8 (inductor's partition under per-op SAC and "
                      "torchao's float8 linears are not modelled)"), ()
    spec = _base(r)
    spec.update(model=_untied_model(r, "llama"),
                precision="bf16", optimizer="adamw", runtime="fsdp2",
                recompute="selective" if r["recompute"].startswith("selective") else "full",
                flash_attention=True, zero_stage=3, stage="last")
    return spec, "", ()


PARSERS = {
    "megatron_ci_goldens": (_megatron, "tensors"),
    "torchtune": (_torchtune, "tensors"),
    "hf_transformers_docs": (_hf_docs, "device"),
    "ms_swift": (_ms_swift, "reserved"),
    "colossalchat_sft": (_colossalchat, "tensors"),
    "colossalai_lightning_gpt2xl": (_colossal_lightning, "tensors"),
    "torchtitan": (_torchtitan, "reserved"),  # LOCAL_DIR
}


def load_rows(directory: Path | None = None, sources: tuple[str, ...] | None = None
              ) -> list[RealRow]:
    """Every row of every CSV (of ``sources`` only, when given), deduplicated by (spec,
    GPU); skipped rows keep a reason. A CSV absent from ``directory`` is read from
    ``LOCAL_DIR``."""
    if directory is None:
        directory = LOCAL_DIR if sources and all(
            (LOCAL_DIR / f"{s}.csv").is_file() for s in sources) else data_dir()
    out: list[RealRow] = []
    for stem, (parse, quantity) in PARSERS.items():
        if sources is not None and stem not in sources:
            continue
        merged: dict[str, list[tuple[str, float]]] = {}
        specs: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {}
        path = directory / f"{stem}.csv"
        if not path.is_file() and (LOCAL_DIR / path.name).is_file():
            path = LOCAL_DIR / path.name
        with open(path, encoding="utf-8") as fh:
            for r in csv.DictReader(fh):
                spec, skip, tags = parse(r)
                gib = float(r["peak_gib"])
                if spec is None:
                    out.append(RealRow(stem, r["source_id"], None, quantity, int(gib * GIB),
                                       skip=skip, ids=[r["source_id"]]))
                    continue
                # allocated peaks do not depend on the GPU type: merge across GPUs too
                keyed = {k: v for k, v in spec.items() if k != "gpu" or quantity != "tensors"}
                key = repr(sorted(keyed.items()))
                merged.setdefault(key, []).append((r["source_id"], gib))
                specs.setdefault(key, (spec, tags))
        for key, items in merged.items():
            values = [g for _, g in items]
            med = statistics.median(values)
            spec, tags = specs[key]
            out.append(RealRow(stem, items[0][0], spec, quantity, int(med * GIB),
                               duplicates=len(items),
                               spread_pct=100.0 * (max(values) - min(values)) / med,
                               ids=[i for i, _ in items], tags=tags))
    return out


# -- calibration and leave-one-source-out evaluation -------------------------------------
UNCALIBRATED = "flags"
"""The tag of rows that fit no constant (see the module docstring)."""

QUANTILE = 0.95
"""The planner's margin covers this share of held-out under-predictions (``margin_from``)."""


@dataclass
class Prediction:
    """One usable row predicted with constants fitted without its source."""

    row: RealRow
    predicted: int  # the row's own quantity
    tensors: int
    fitted: NonTensorModel

    @property
    def err_pct(self) -> float:
        return 100.0 * (self.predicted - self.row.measured_bytes) / self.row.measured_bytes


def _parts(row: RealRow, base: NonTensorModel) -> tuple[int, int, int]:
    """(tensors incl. workspace, bytes outside the allocator, counted tensors) of a row."""
    req = parse_memory_spec(row.spec)
    mem = estimate_request(req, replace(base, slack_fraction=0.0, slack_bytes=0))
    return mem.tensors, mem.overhead, mem.tensors


def fit_slack(rows: list[RealRow], base: NonTensorModel) -> float:
    """The allocator-slack fraction: the median over the reserved / nvidia-smi rows (not
    tagged ``UNCALIBRATED``) of
    (measured − tensors − outside) / tensors (outside: the context and NCCL, nvidia-smi
    rows only); 0 without such rows. The median (not a
    least-squares fit) keeps one fragmented outlier from setting it."""
    ratios = []
    for row in rows:
        if row.quantity == "tensors" or UNCALIBRATED in row.tags:
            continue
        tensors, outside, _ = _parts(row, base)
        if row.quantity == "reserved":
            outside = 0  # max_memory_reserved holds no context
        ratios.append((row.measured_bytes - tensors - outside) / tensors)
    return max(0.0, statistics.median(ratios)) if ratios else 0.0


def predict(row: RealRow, model: NonTensorModel) -> Prediction:
    req = parse_memory_spec(row.spec)
    mem = estimate_request(req, model)
    value = {"tensors": mem.tensors, "reserved": mem.reserved, "device": mem.device}
    return Prediction(row, value[row.quantity], mem.tensors, model)


def leave_one_source_out(rows: list[RealRow], base: NonTensorModel = NON_TENSOR
                         ) -> list[Prediction]:
    """Every usable row predicted with the slack fitted on the other sources only."""
    usable = [r for r in rows if not r.skip]
    out = []
    for source in dict.fromkeys(r.source for r in usable):
        train = [r for r in usable if r.source != source]
        model = replace(base, slack_fraction=round(fit_slack(train, base), 4))
        out += [predict(r, model) for r in usable if r.source == source]
    return out


def margin_from(preds: list[Prediction], quantile: float = QUANTILE,
                calibrated_only: bool = True) -> float:
    """The fraction of a GPU to keep free so that ``quantile`` of the rows fit: the
    quantile of 1 − predicted/measured (0 when every row is over-predicted), rounded up to
    a whole per cent; over the rows not tagged ``UNCALIBRATED`` unless ``calibrated_only``
    is false."""
    need = sorted(max(0.0, 1.0 - p.predicted / p.row.measured_bytes) for p in preds
                  if not calibrated_only or UNCALIBRATED not in p.row.tags)
    if not need:
        return 0.0
    k = min(len(need) - 1, int(quantile * len(need)))
    return float(np.ceil(need[k] * 100.0) / 100.0)


def stats(errs: list[float]) -> dict[str, Any]:
    """n, MAPE, worst, signed bias and the count under-predicted by more than 5 %."""
    if not errs:
        return dict(n=0, mape=None, worst_pct=None, bias_pct=None, under_5pct=0)
    return dict(n=len(errs), mape=sum(map(abs, errs)) / len(errs),
                worst_pct=max(errs, key=abs), worst_under_pct=min(0.0, min(errs)),
                bias_pct=sum(errs) / len(errs), under_5pct=sum(e < -5.0 for e in errs))
