"""Predicted vs measured peak memory per GPU, three ways.

    python -m benchmarks.memory_accuracy [--json] [--quick] [--device cpu|cuda] [--no-selfcheck]

* ``selfcheck``: ``predictor.memory`` (and the Frenzy formula) against real training steps
  of the rank-local PyTorch shard (``predictor.measure``). On the CPU every configuration
  runs under fake tensors with exact storage tracking (device "cpu-fake"); with
  ``--device cuda`` the configurations that fit run for real (``max_memory_allocated``).
* ``real``: every usable row of the public real-GPU data (``benchmarks.real_memory``),
  predicted with the row's own runtime profile and measured quantity (allocated, reserved
  or nvidia-smi), leave-one-source-out: the free constant (the allocator slack) is fitted on
  the other sources only, and so is the planner margin the row is judged with.
* ``runtime``: the built-in trainer's own tensor peak (``benchmarks.trainer_memory``: its
  ``ParallelTransformer`` and loop step under fake tensors) against the ``frenzy`` profile,
  over the plans of what it executes (tp with the vocab-parallel head, dp, pipeline stages,
  ZeRO-1/2/3, micro-batch, recomputation, precision), also split into the plans with and
  without ZeRO (``runtime_zero``, ``runtime_no_zero``), the ZeRO-3 ones (``runtime_zero3``)
  and the pipelined ones (``runtime_pp``: the worst stage's peak; ``runtime_pp_stages``:
  every stage against its own measurement).
* ``runtime_cuda``: the same trainer's peaks measured on a real GPU (``benchmarks.trainer_cuda``
  rows committed under docs/gpu_runs/), priced again by today's predictor.
* ``hf_trainer_cuda``: Hugging Face's ``transformers.Trainer`` on a real GPU against the
  ``hf-trainer`` profile (``benchmarks.hf_trainer_cuda`` rows under docs/gpu_runs/), split
  into the plans the profile's terms were found on (``tuning``) and the plans measured once
  after they were committed (``holdout``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import real_memory
from predictor.measure import measure_peak
from predictor.memory import estimate_memory, frenzy_memory
from predictor.overhead import FIT_MARGIN, NON_TENSOR
from predictor.spec import ModelSpec, ParallelConfig, TrainingSpec

log = logging.getLogger("benchmarks.memory_accuracy")
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Case:
    model: str
    train: dict[str, Any]
    par: dict[str, Any]

    def specs(self) -> tuple[ModelSpec, TrainingSpec, ParallelConfig]:
        m = ModelSpec.from_name(self.model)
        tr = TrainingSpec(**self.train)
        par = ParallelConfig(**self.par)
        tr.check_against(m)
        par.check(m, tr)
        return m, tr, par

    def label(self) -> str:
        t, p = self.train, self.par
        bits = [self.model, f"s{t['seq_len']}", f"B{t['global_batch']}",
                t.get("precision", "bf16"), t.get("optimizer", "adamw"),
                f"tp{p.get('tp', 1)}pp{p.get('pp', 1)}dp{p.get('dp', 1)}",
                f"mb{p.get('micro_batch', 1)}", f"rc={p.get('recompute', 'none')}",
                f"z{p.get('zero_stage', 0)}",
                "flash" if p.get("flash_attention", True) else "noflash"]
        if p.get("sequence_parallel") and p.get("tp", 1) > 1:
            bits.append("sp")
        return " ".join(bits)


def _c(model: str, s: int, B: int, prec: str = "bf16", opt: str = "adamw", **par: Any) -> Case:
    flash = par.get("flash_attention", True)
    return Case(model, dict(global_batch=B, seq_len=s, precision=prec, optimizer=opt,
                            flash_attention=flash), par)


CASES: list[Case] = [
    # gpt2 family (124M-6.7B)
    _c("gpt2", 1024, 8, micro_batch=8),
    _c("gpt2", 1024, 8, "fp32", "adam", micro_batch=4, flash_attention=False),
    _c("gpt2", 512, 16, "fp16", "sgd", micro_batch=16, recompute="selective"),
    _c("gpt2-medium", 1024, 32, micro_batch=4, dp=4, zero_stage=1),
    _c("gpt2-medium", 1024, 16, "fp32", "sgd", micro_batch=2, tp=2, flash_attention=False),
    _c("gpt2-large", 1024, 16, micro_batch=2, tp=2, pp=2, sequence_parallel=True),
    _c("gpt2-xl", 1024, 32, micro_batch=4, pp=2, dp=2, recompute="full"),
    _c("gpt2-350m", 1024, 64, micro_batch=8, dp=8, zero_stage=2),
    _c("gpt2-7b", 2048, 32, micro_batch=1, tp=8, pp=4, sequence_parallel=True),
    _c("gpt2-7b", 2048, 64, micro_batch=2, tp=4, pp=4, dp=2, zero_stage=1,
       recompute="selective", flash_attention=False, sequence_parallel=True),
    # bert (110M-340M)
    _c("bert-base", 512, 32, "bf16", "sgd", micro_batch=16, recompute="selective",
       flash_attention=False),
    _c("bert-base", 512, 64, micro_batch=8, dp=8, zero_stage=3),
    _c("bert-large", 512, 32, micro_batch=8, tp=2, sequence_parallel=True),
    _c("bert-large", 512, 32, "fp32", "adam", micro_batch=4, pp=2, recompute="full"),
    _c("bert-large", 512, 16, micro_batch=16, flash_attention=False),
    # llama family (7B-70B)
    _c("llama-2-7b", 4096, 16, micro_batch=1, tp=4, pp=4, sequence_parallel=True),
    _c("llama-2-7b", 2048, 16, micro_batch=2, tp=2, pp=2, recompute="full"),
    _c("llama-2-7b", 4096, 64, micro_batch=1, tp=8, dp=8, zero_stage=1),
    _c("llama-2-7b", 2048, 32, micro_batch=4, tp=8, pp=1, dp=4, zero_stage=3,
       recompute="selective"),
    _c("llama-2-7b", 1024, 32, "fp32", "adam", micro_batch=2, tp=8, pp=2,
       flash_attention=False),
    _c("llama-2-13b", 4096, 32, micro_batch=1, tp=8, pp=4, sequence_parallel=True),
    _c("llama-2-13b", 2048, 64, micro_batch=4, tp=4, pp=8, dp=2, zero_stage=2,
       recompute="selective"),
    _c("llama-2-70b", 4096, 64, micro_batch=1, tp=8, pp=8, sequence_parallel=True),
    _c("llama-2-70b", 4096, 128, micro_batch=2, tp=8, pp=8, dp=2, zero_stage=1,
       recompute="full", sequence_parallel=True),
    _c("llama-2-70b", 2048, 128, "bf16", "sgd", micro_batch=1, tp=8, pp=4, dp=4,
       zero_stage=3, recompute="full"),
    _c("llama-3-8b", 8192, 16, micro_batch=1, tp=4, pp=2, sequence_parallel=True),
    _c("llama-3-8b", 8192, 32, micro_batch=1, tp=8, pp=2, dp=2, recompute="selective",
       zero_stage=1, sequence_parallel=True),
    _c("llama-3-8b", 2048, 64, micro_batch=4, tp=2, pp=4, dp=2, zero_stage=2),
    _c("llama-3-70b", 8192, 64, micro_batch=1, tp=8, pp=8, recompute="full",
       sequence_parallel=True),
    _c("mistral-7b", 8192, 16, micro_batch=1, tp=4, pp=4, sequence_parallel=True),
    _c("mistral-7b", 4096, 32, micro_batch=2, tp=8, dp=2, zero_stage=3,
       flash_attention=False),
    # qwen2 (7B)
    _c("qwen2-7b", 4096, 32, micro_batch=1, tp=4, pp=2, dp=2, zero_stage=1,
       sequence_parallel=True),
    _c("qwen2-7b", 2048, 32, micro_batch=2, tp=4, pp=4, recompute="selective"),
    _c("qwen2-7b", 8192, 16, micro_batch=1, tp=4, pp=7, recompute="full",
       sequence_parallel=True),
    _c("qwen2-7b", 1024, 16, "fp32", "sgd", micro_batch=1, tp=2, pp=2, dp=4, zero_stage=2),
    # qwen3 (per-head q/k norms; 0.6B's heads 2x wider than hidden / heads) and Mistral-Nemo
    # (Q 4096 wide over hidden 5120)
    _c("qwen3-0.6b", 4096, 16, micro_batch=2, dp=8, zero_stage=1, recompute="selective"),
    _c("qwen3-0.6b", 2048, 16, micro_batch=4, tp=2, pp=2, sequence_parallel=True,
       flash_attention=False),
    _c("qwen3-8b", 4096, 32, micro_batch=1, tp=4, pp=4, dp=2, zero_stage=1, recompute="full",
       sequence_parallel=True),
    _c("mistral-nemo-12b", 8192, 16, micro_batch=1, tp=8, pp=4, sequence_parallel=True),
    _c("mistral-nemo-12b", 4096, 32, micro_batch=2, tp=8, pp=2, dp=2, zero_stage=2,
       recompute="selective"),
    # gpt_neox (1.4B-20B)
    _c("pythia-1.4b", 2048, 16, micro_batch=2, tp=2, dp=4, zero_stage=3),
    _c("pythia-1.4b", 2048, 16, "fp16", "adam", micro_batch=4, flash_attention=False,
       recompute="selective"),
    _c("pythia-1.4b", 512, 64, micro_batch=16, pp=2, dp=2),
    _c("gpt-neox-20b", 2048, 32, micro_batch=1, tp=4, pp=4, dp=2, sequence_parallel=True),
    _c("gpt-neox-20b", 2048, 64, micro_batch=2, tp=8, pp=4, dp=2, zero_stage=1,
       recompute="full", sequence_parallel=True),
    _c("gpt-neox-20b", 2048, 32, micro_batch=4, tp=8, pp=11, recompute="selective"),
]

QUICK = [1, 10]


def run(cases: list[Case], device: str) -> list[dict[str, Any]]:
    rows = []
    for i, case in enumerate(cases):
        m, tr, par = case.specs()
        pred = estimate_memory(m, tr, par)
        if device != "cpu" and pred.tensors > _cuda_free_bytes():
            log.info("[%d/%d] skip (does not fit this GPU): %s", i + 1, len(cases), case.label())
            continue
        t0 = time.perf_counter()
        meas = measure_peak(m, tr, par, device=device)
        dt = time.perf_counter() - t0
        ours = pred.tensors
        frenzy = frenzy_memory(m, tr, par)
        row = dict(config=case.label(), stage=meas.stage, measured=meas.peak_bytes,
                   measured_first_step=meas.first_step_peak,
                   measured_reserved=meas.peak_reserved_bytes, ours=ours, frenzy=frenzy,
                   err_ours=100.0 * (ours - meas.peak_bytes) / meas.peak_bytes,
                   err_frenzy=100.0 * (frenzy - meas.peak_bytes) / meas.peak_bytes,
                   seconds=round(dt, 2))
        log.info("[%d/%d] %.1fs %s: measured %.2f GiB, ours %+.2f%%, frenzy %+.1f%%",
                 i + 1, len(cases), dt, case.label(), meas.peak_bytes / GIB, row["err_ours"],
                 row["err_frenzy"])
        rows.append(row)
    return rows


def _cuda_free_bytes() -> int:
    import torch

    free, _ = torch.cuda.mem_get_info()
    return int(free * 0.9)


def summary(rows: list[dict[str, Any]], device: str) -> dict[str, Any]:
    n = len(rows)
    return dict(
        n=n,
        mape_ours=sum(abs(r["err_ours"]) for r in rows) / n if n else float("nan"),
        max_err_ours=max((abs(r["err_ours"]) for r in rows), default=float("nan")),
        mape_frenzy=sum(abs(r["err_frenzy"]) for r in rows) / n if n else float("nan"),
        max_err_frenzy=max((abs(r["err_frenzy"]) for r in rows), default=float("nan")),
        device="cpu-fake" if device == "cpu" else device,
    )


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'config':<88} | st | measured GiB | ours GiB | err % | frenzy GiB | err % |\n"
            f"|{'-' * 90}|----|-------------:|---------:|------:|-----------:|------:|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['config']:<88} | {r['stage']:>2} | {r['measured'] / GIB:12.3f} | "
            f"{r['ours'] / GIB:8.3f} | {r['err_ours']:+5.2f} | {r['frenzy'] / GIB:10.2f} | "
            f"{r['err_frenzy']:+5.0f} |")
    return "\n".join(lines)


RUNTIME_NOTE = ("the built-in trainer executes tp (with the vocab-parallel embedding, head "
                "and cross entropy), dp, pipeline stages (1F1B), ZeRO-1/2/3, micro-batches and "
                "recomputation: the plans cover those, measured on the CPU under fake tensors "
                "(a pipeline's worst stage)")


def real_section(directory: Any = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``real`` figures (leave-one-source-out) and one row per prediction."""
    rows = real_memory.load_rows(directory)
    preds = real_memory.leave_one_source_out(rows, NON_TENSOR)
    sources = list(dict.fromkeys(p.row.source for p in preds))
    margins = {src: real_memory.margin_from([p for p in preds if p.row.source != src])
               for src in sources}
    out_rows = []
    for p in preds:
        m = margins[p.row.source]
        after = 100.0 * (p.predicted / (1.0 - m) - p.row.measured_bytes) / p.row.measured_bytes
        after_fit = 100.0 * (p.predicted / (1.0 - FIT_MARGIN) - p.row.measured_bytes) \
            / p.row.measured_bytes
        out_rows.append(dict(
            source=p.row.source, row=p.row.row_id, merged=p.row.duplicates,
            spread_pct=round(p.row.spread_pct, 1), tags=list(p.row.tags),
            runtime=p.row.spec["runtime"], quantity=p.row.quantity,
            measured_gib=p.row.measured_bytes / GIB, predicted_gib=p.predicted / GIB,
            err_pct=p.err_pct, slack_fraction=p.fitted.slack_fraction, margin=m,
            err_after_margin_pct=after, err_after_fit_margin_pct=after_fit))
    errs = [r["err_pct"] for r in out_rows]
    summ = real_memory.stats(errs)
    summ["sources"] = len(sources)
    summ["by_source"] = {src: {**real_memory.stats(
        [r["err_pct"] for r in out_rows if r["source"] == src]),
        "slack_fraction": next(r["slack_fraction"] for r in out_rows if r["source"] == src),
        "margin_from_others": margins[src]} for src in sources}
    summ["mape_mean_of_sources"] = sum(v["mape"] for v in summ["by_source"].values()) \
        / len(sources)
    summ["megatron_7b"] = real_memory.stats(
        [r["err_pct"] for r in out_rows if "megatron-7b" in r["tags"]])
    summ["megatron_toy"] = real_memory.stats(
        [r["err_pct"] for r in out_rows if "megatron-toy" in r["tags"]])
    summ["under_5pct_after_margin"] = sum(r["err_after_margin_pct"] < -5.0 for r in out_rows)
    summ["fit_margin"] = FIT_MARGIN
    summ["margin_all_rows"] = real_memory.margin_from(preds)
    summ["margin_all_rows_incl_flags"] = real_memory.margin_from(preds, calibrated_only=False)
    flag = real_memory.UNCALIBRATED
    summ["flags"] = real_memory.stats([r["err_pct"] for r in out_rows if flag in r["tags"]])
    summ["without_flags"] = real_memory.stats(
        [r["err_pct"] for r in out_rows if flag not in r["tags"]])
    summ["under_5pct_after_fit_margin"] = sum(
        r["err_after_fit_margin_pct"] < -5.0 for r in out_rows)
    skipped: dict[str, int] = {}
    for r in rows:
        if r.skip:
            key = f"{r.source}: {r.skip}"
            skipped[key] = skipped.get(key, 0) + 1
    summ["skipped"] = skipped
    summ["raw_rows_used"] = sum(r.duplicates for r in rows if not r.skip)
    return summ, out_rows


def real_table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'source':<27} | {'row':<58} | rt         | qty | n  | measured GiB | "
            "predicted GiB | err % | after margin % |\n"
            f"|{'-' * 29}|{'-' * 60}|------------|-----|----|-------------:|"
            "--------------:|------:|---------------:|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['source']:<27} | {r['row'][-58:]:<58} | {r['runtime']:<10} | "
            f"{r['quantity'][:3]} | {r['merged']:>2} | {r['measured_gib']:12.3f} | "
            f"{r['predicted_gib']:13.3f} | {r['err_pct']:+5.1f} | "
            f"{r['err_after_margin_pct']:+14.1f} |")
    return "\n".join(lines)


def source_table(summ: dict[str, Any]) -> str:
    lines = ["| source | n | MAPE % | worst % | bias % | under 5 % | slack fit on others | "
             "margin from others |", "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for src, v in summ["by_source"].items():
        lines.append(f"| {src} | {v['n']} | {v['mape']:.1f} | {v['worst_pct']:+.1f} | "
                     f"{v['bias_pct']:+.1f} | {v['under_5pct']} | {v['slack_fraction']:.3f} | "
                     f"{v['margin_from_others']:.2f} |")
    for name in ("megatron_7b", "megatron_toy"):
        v = summ[name]
        lines.append(f"| ({name.replace('_', ' ')}) | {v['n']} | {v['mape']:.1f} | "
                     f"{v['worst_pct']:+.1f} | {v['bias_pct']:+.1f} | {v['under_5pct']} | | |")
    lines.append(f"| **all** | {summ['n']} | {summ['mape']:.1f} | {summ['worst_pct']:+.1f} | "
                 f"{summ['bias_pct']:+.1f} | {summ['under_5pct']} | | |")
    return "\n".join(lines)


def runtime_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"| {'plan (built-in trainer)':<62} | trainer MiB | predicted MiB | err % |",
             f"|{'-' * 64}|------------:|--------------:|------:|"]
    for r in rows:
        lines.append(f"| {r['config']:<62} | {r['measured'] / 2**20:11.1f} | "
                     f"{r['predicted'] / 2**20:13.1f} | {r['err_pct']:+5.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--quick", action="store_true", help="a small selfcheck subset (CI)")
    ap.add_argument("--device", default="cpu", help="cpu (fake tensors) or cuda")
    ap.add_argument("--no-selfcheck", action="store_true", help="only the real-GPU rows")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    out: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    if not args.no_selfcheck:
        cases = [CASES[i] for i in QUICK] if args.quick else CASES
        rows = run(cases, args.device)
        summ = summary(rows, args.device)
        print(table(rows))
        print(f"\nselfcheck n={summ['n']}  MAPE ours {summ['mape_ours']:.2f}% "
              f"(max {summ['max_err_ours']:.2f}%)  MAPE frenzy {summ['mape_frenzy']:.1f}% "
              f"(max {summ['max_err_frenzy']:.0f}%)\n")
        errs = [r["err_ours"] for r in rows]
        out.update(summ)
        out["selfcheck"] = {**real_memory.stats(errs), "device": summ["device"]}
        out["selfcheck_mape"] = out["selfcheck"]["mape"]
    else:
        out["selfcheck"], out["selfcheck_mape"] = None, None
    try:
        real, real_rows = real_section()
    except FileNotFoundError as exc:
        log.warning("real-GPU rows skipped: %s", exc)
        real, real_rows = None, []
    if real is not None:
        print(real_table(real_rows))
        print()
        print(source_table(real))
        print(f"\nreal n={real['n']} ({real['raw_rows_used']} raw rows, {real['sources']} "
              f"sources)  MAPE {real['mape']:.1f}%  worst under {real['worst_under_pct']:.1f}%  "
              f"under 5%: {real['under_5pct']}  after the held-out margin: "
              f"{real['under_5pct_after_margin']}")
    out["real"] = real
    out["real_mape"] = real["mape"] if real else None
    out["real_worst_under_pct"] = real["worst_under_pct"] if real else None
    out["real_under_5pct"] = real["under_5pct"] if real else None
    out["real_n"] = real["n"] if real else 0
    from benchmarks import trainer_memory

    t_cases = trainer_memory.QUICK_CASES if args.quick else trainer_memory.ALL_CASES
    runtime_rows = trainer_memory.run(t_cases)
    out["runtime"] = {**real_memory.stats([r["err_pct"] for r in runtime_rows]),
                      "device": "cpu-fake", "profile": "frenzy", "note": RUNTIME_NOTE}
    out["runtime_mape"] = out["runtime"]["mape"]
    for key, keep in (("runtime_zero", lambda r: r["zero_stage"] > 0),
                      ("runtime_no_zero", lambda r: r["zero_stage"] == 0),
                      ("runtime_zero3", lambda r: r["zero_stage"] == 3),
                      ("runtime_pp", lambda r: r.get("pp", 1) > 1)):
        errs = [r["err_pct"] for r in runtime_rows if keep(r)]
        out[key] = real_memory.stats(errs) if errs else None
        out[f"{key}_mape"] = out[key]["mape"] if errs else None
    # every pipeline stage against its own measurement (the plan's figure is the worst's)
    stage_errs = [st["err_pct"] for r in runtime_rows for st in r.get("stages", [])]
    out["runtime_pp_stages"] = real_memory.stats(stage_errs) if stage_errs else None
    print()
    print(runtime_table(runtime_rows))
    rt = out["runtime"]
    print(f"\nruntime n={rt['n']}  MAPE {rt['mape']:.2f}%  worst {rt['worst_pct']:+.2f}%  "
          f"bias {rt['bias_pct']:+.2f}%  under 5%: {rt['under_5pct']}")
    for key, what in (("runtime_zero", "ZeRO plans"), ("runtime_no_zero", "without ZeRO"),
                      ("runtime_zero3", "ZeRO-3 plans"), ("runtime_pp", "pipeline plans")):
        if out[key]:
            print(f"  {what}: n={out[key]['n']}  MAPE {out[key]['mape']:.2f}%  "
                  f"worst {out[key]['worst_pct']:+.2f}%")
    if out["runtime_pp_stages"]:
        st = out["runtime_pp_stages"]
        print(f"  every pipeline stage: n={st['n']}  MAPE {st['mape']:.2f}%  worst "
              f"{st['worst_pct']:+.2f}%  under 5%: {st['under_5pct']}")
    from benchmarks import trainer_cuda

    cuda_rows = trainer_cuda.replay(trainer_cuda.COMMITTED_ROWS)
    if cuda_rows:
        cuda = trainer_cuda.summary(cuda_rows)
        out["runtime_cuda"] = cuda
        out["runtime_cuda_mape"] = cuda["tensors"]["mape"]
        out["runtime_cuda_n"] = cuda["tensors"]["n"]
        print(f"\nruntime on a real GPU ({cuda['device_name']}, the built-in trainer's committed "
              f"rows, docs/trainer_cuda.md): n={cuda['tensors']['n']}  tensors MAPE "
              f"{cuda['tensors']['mape']:.2f}%  worst {cuda['tensors']['worst']:+.1f}%  "
              f"device MAPE {cuda['device']['mape']:.1f}%  OOM after the margin: "
              f"{cuda['oom_after_margin']}")
    from benchmarks import hf_trainer_cuda

    hf = hf_trainer_cuda.committed_summary()
    if hf:
        out["hf_trainer_cuda"] = hf
        for split in ("tuning", "holdout", "lightning"):
            if split in hf:
                t = hf[split]["tensors"]
                out[f"hf_trainer_cuda_{split}_mape"] = t["mape"]
                out[f"hf_trainer_cuda_{split}_n"] = t["n"]
                print(f"Hugging Face Trainer on a real GPU ({hf[split]['device_name']}, "
                      f"{split} plans, docs/trainer_cuda.md): n={t['n']}  tensors MAPE "
                      f"{t['mape']:.2f}%  worst {t['worst']:+.1f}%  under 5%: "
                      f"{t['under_5pct']}  device MAPE {hf[split]['device']['mape']:.1f}%  "
                      f"OOM after the margin: {hf[split]['oom_after_margin']}")
    if args.json:
        print(json.dumps({**out, "rows": rows, "real_rows": real_rows,
                          "runtime_rows": runtime_rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
