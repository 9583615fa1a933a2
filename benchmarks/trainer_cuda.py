"""The built-in trainer on a real GPU: measured peak memory and step time against the planner.

    python -m benchmarks.trainer_cuda [--json] [--quick] [--out FILE.jsonl] [--gpu NAME]
    python -m benchmarks.trainer_cuda --replay docs/gpu_runs/trainer_cuda_h200*.jsonl [--json]

Each plan runs ``orchestrator.trainer.loop.train`` itself (synthetic data, ``steps`` steps)
on the one CUDA device of this machine, and is priced by the ``frenzy`` runtime profile:
``predictor.memory_spec.memory_report`` (tensors / reserved / device bytes) and
``predictor.step_time.estimate_step_time`` for ``--gpu``, the catalog type of this device.

Measured, per step (the peak statistics are reset after each step):
``torch.cuda.max_memory_allocated`` (the tensors), ``max_memory_reserved`` (the caching
allocator's segments) and the step's wall time (the loop synchronises on its loss every
step). ``device`` is what nvidia-smi would read for the process at the peak: the process's
use outside the allocator (``mem_get_info`` used minus reserved, at the end of the run, while
the cache still holds its segments) plus the reserved peak. Peaks are over all measured steps
(the first step allocates the optimizer states); step time is the median over steps 3 on.

Plans of one rank run in this process one after the other (the cache emptied and the peak
statistics reset between them). Plans of several ranks run as that many local processes on
the one GPU with ``FRENZY_DIST_BACKEND=gloo`` (NCCL refuses two ranks on one device): rank 0's
memory is the plan's per-rank memory (with pipeline stages, each stage's first rank is
measured and priced with its stage, and the plan's figure is the largest stage's); their
step time is not a plan's and is not reported.
The checkpoint write is skipped (disk I/O of the last step, not the training step).

Rows record the trainer's head: ``"vocab_parallel": true`` since the trainer splits the
embedding, head and loss over the tp ranks by vocabulary rows. Rows without the key were
measured before, with the embedding and head replicated on every tp rank and
``F.cross_entropy`` at every tp; ``--replay`` prices those with the ``frenzy`` profile's
replicated-head variant (``REPLICATED_HEAD``), so they keep testing what actually ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("benchmarks.trainer_cuda")
GIB = 1 << 30
STEPS = 6

TINYLLAMA = {"family": "llama", "num_layers": 22, "hidden_size": 2048, "num_heads": 32,
             "num_kv_heads": 4, "ffn_hidden_size": 5632, "vocab_size": 32000,
             "max_seq_len": 2048, "tie_embeddings": False, "name": "tinyllama-1.1b"}
QWEN2_05B = {"family": "qwen2", "num_layers": 24, "hidden_size": 896, "num_heads": 14,
             "num_kv_heads": 2, "ffn_hidden_size": 4864, "vocab_size": 151936,
             "max_seq_len": 2048, "tie_embeddings": True, "name": "qwen2-0.5b"}


REPLICATED_HEAD = {"vocab_parallel": False}
"""``frenzy`` profile overrides for the trainer as it ran before its vocab-parallel head:
the embedding and head replicated on the tp ranks, ``F.cross_entropy`` on ``logits.float()``
at every tp (the profile's ``logits_*`` fields; its ``logits_*_tp`` apply only when
vocab-parallel)."""


@dataclass(frozen=True, slots=True)
class Plan:
    model: str | dict[str, Any]
    seq_len: int
    global_batch: int
    precision: str = "bf16"
    optimizer: str = "adamw"
    micro_batch: int = 1
    recompute: str = "none"
    tp: int = 1
    dp: int = 1
    zero: int = 0
    pp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def spec(self, gpu: str | None = None, vocab_parallel: bool = True) -> dict[str, Any]:
        """The ``frenzy memory`` spec of this plan (on ``gpu``, when given; with the
        replicated head of rows measured before the vocab-parallel one, when not
        ``vocab_parallel``)."""
        spec = {"model": self.model, "global_batch": self.global_batch,
                "seq_len": self.seq_len, "precision": self.precision,
                "optimizer": self.optimizer, "tp": self.tp, "dp": self.dp, "pp": self.pp,
                "micro_batch": self.micro_batch, "recompute": self.recompute,
                "zero_stage": self.zero, "runtime": "frenzy"}
        if not vocab_parallel:
            spec["runtime_options"] = dict(REPLICATED_HEAD)
        return spec if gpu is None else {**spec, "gpu": gpu}

    def label(self) -> str:
        name = self.model if isinstance(self.model, str) else self.model["name"]
        return (f"{name} s{self.seq_len} B{self.global_batch} {self.precision} "
                f"{self.optimizer} tp{self.tp}dp{self.dp} mb{self.micro_batch} "
                f"rc={self.recompute}" + (f" zero{self.zero}" if self.zero else "")
                + (f" pp{self.pp}" if self.pp > 1 else ""))


PLANS: list[Plan] = [
    Plan("gpt2", 1024, 16, micro_batch=4),
    Plan("gpt2", 1024, 16, "fp32", micro_batch=8),
    Plan("gpt2-medium", 1024, 16, micro_batch=8, recompute="selective"),
    Plan("gpt2-medium", 1024, 32, micro_batch=16, recompute="full"),
    Plan("gpt2-large", 1024, 8, micro_batch=8),
    Plan("gpt2-large", 1024, 8, "fp16", "adam", micro_batch=4, recompute="selective"),
    Plan("bert-large", 512, 32, micro_batch=32),
    Plan("pythia-1.4b", 2048, 8, micro_batch=4, recompute="selective"),
    Plan("pythia-1.4b", 2048, 8, micro_batch=8, recompute="full"),
    Plan("pythia-1.4b", 1024, 16, "fp32", micro_batch=2),
    Plan("gpt2-xl", 1024, 8, micro_batch=4),
    Plan("gpt2-xl", 1024, 8, "bf16", "sgd", micro_batch=8, recompute="full"),
    Plan(TINYLLAMA, 2048, 8, micro_batch=4, recompute="selective"),
    Plan(TINYLLAMA, 2048, 8, micro_batch=2),
    Plan(QWEN2_05B, 1024, 16, micro_batch=8),
    # several ranks on the one GPU (gloo): rank 0's memory only
    Plan("gpt2-medium", 1024, 16, micro_batch=4, tp=2),
    Plan(TINYLLAMA, 1024, 8, micro_batch=2, tp=2, dp=2, recompute="selective"),
    Plan("gpt2-large", 1024, 8, micro_batch=2, tp=4),
    Plan("pythia-1.4b", 1024, 8, micro_batch=4, dp=2),
    # ZeRO-1/2 (states, and under ZeRO-2 gradients, sharded over dp) and the vocab-parallel
    # head at tp > 1: several ranks on the one GPU, rank 0's memory only
    Plan("pythia-1.4b", 1024, 8, micro_batch=4, dp=2, zero=1),
    Plan("pythia-1.4b", 1024, 8, micro_batch=4, dp=2, zero=2),
    Plan("pythia-1.4b", 1024, 4, micro_batch=2, dp=2, zero=2),  # one micro-batch a step
    Plan("gpt2-large", 1024, 8, micro_batch=2, dp=4, zero=2),
    Plan("gpt2-medium", 1024, 16, "fp16", "adam", micro_batch=4, dp=2, zero=1),
    Plan(TINYLLAMA, 1024, 8, micro_batch=2, tp=2, dp=2, recompute="selective", zero=2),
    Plan(QWEN2_05B, 1024, 16, micro_batch=8, tp=2),
    Plan(QWEN2_05B, 1024, 16, micro_batch=4, dp=2, recompute="full", zero=2),
    Plan("bert-large", 512, 32, micro_batch=16, tp=2),
    Plan("pythia-1.4b", 1024, 8, micro_batch=4, tp=4, recompute="full"),
    Plan(TINYLLAMA, 1024, 4, micro_batch=1, tp=2, dp=2, zero=1),  # one micro-batch a step
    # pipeline stages under 1F1B (every stage's first rank measured) and ZeRO-3 (the blocks'
    # weights sharded, gathered around each block's forward and backward): several ranks on
    # the one GPU; priced before they first ran (third device session)
    Plan("gpt2-medium", 1024, 16, micro_batch=2, pp=2),
    Plan("pythia-1.4b", 1024, 8, micro_batch=1, pp=4, recompute="selective"),
    Plan(TINYLLAMA, 1024, 8, micro_batch=2, tp=2, pp=2, recompute="selective"),
    Plan("gpt2-large", 1024, 8, micro_batch=1, dp=2, pp=2, recompute="full"),
    Plan(QWEN2_05B, 1024, 16, micro_batch=4, pp=2),  # the tied head's copy on the last stage
    Plan("gpt2-xl", 1024, 4, micro_batch=1, pp=4),
    Plan(TINYLLAMA, 1024, 8, micro_batch=2, dp=2, pp=2, zero=1),
    Plan("pythia-1.4b", 1024, 8, micro_batch=4, dp=2, zero=3),
    Plan("gpt2-large", 1024, 8, micro_batch=2, dp=4, zero=3, recompute="full"),
    Plan(TINYLLAMA, 1024, 8, micro_batch=2, tp=2, dp=2, recompute="selective", zero=3),
    Plan(QWEN2_05B, 1024, 16, micro_batch=4, dp=2, zero=3),
    Plan("gpt2-medium", 1024, 16, "fp32", "adam", micro_batch=4, dp=2, zero=3),
    Plan("gpt2-xl", 1024, 8, micro_batch=1, dp=2, pp=2, recompute="selective", zero=2),
    Plan("pythia-1.4b", 1024, 16, "fp16", "adam", micro_batch=2, pp=2, recompute="full"),
    Plan("bert-large", 512, 32, micro_batch=4, pp=2),
    Plan(QWEN2_05B, 1024, 16, micro_batch=2, pp=4, recompute="selective"),
    Plan(TINYLLAMA, 1024, 8, micro_batch=2, dp=4, recompute="full", zero=3),
    Plan("gpt2-xl", 1024, 8, micro_batch=4, dp=2, recompute="selective", zero=3),
    Plan("pythia-1.4b", 1024, 4, "fp32", micro_batch=1, dp=2, zero=3),
    # fp32 ZeRO-3 with pipeline stages, no recomputation: each micro-batch in flight keeps the
    # gathered weights its forward's matmuls saved (a stage with m <= pp - stage in 50, 52)
    Plan("gpt2-medium", 1024, 16, "fp32", "adam", micro_batch=2, dp=2, pp=2, zero=3),
    Plan("gpt2-medium", 1024, 6, "fp32", micro_batch=1, dp=2, pp=3, zero=3),
    Plan(TINYLLAMA, 1024, 16, "fp32", micro_batch=2, dp=2, pp=2, zero=3),
    Plan(QWEN2_05B, 1024, 8, "fp32", micro_batch=1, dp=2, pp=4, zero=3),
]
QUICK = [0, 2, 15]
GPU_RUNS = Path(__file__).parents[1] / "docs" / "gpu_runs"
COMMITTED_ROWS = sorted(str(p) for p in GPU_RUNS.glob("trainer_cuda_*.jsonl"))


def predict(plan: Plan, gpu: str, vocab_parallel: bool = True) -> dict[str, Any]:
    """The ``frenzy`` profile's memory and step time of ``plan`` on ``gpu`` (for the
    trainer's replicated head of older rows when not ``vocab_parallel``)."""
    from predictor.gpus import get_gpu
    from predictor.memory_spec import memory_report, parse_memory_spec
    from predictor.step_time import estimate_step_time

    spec = plan.spec(gpu, vocab_parallel)
    mem = memory_report(spec)
    req = parse_memory_spec(spec)
    step = estimate_step_time(req.model, req.train, req.par, get_gpu(gpu), runtime="frenzy")
    out = {"tensors": mem["tensors_bytes"], "reserved": mem["reserved_bytes"],
           "device": mem["device_bytes"], "step_s": step.total_s,
           "breakdown": mem["breakdown"]}
    if plan.pp > 1:
        out["stages"] = [_figures(memory_report({**spec, "stage": i})) for i in range(plan.pp)]
    return out


def _figures(mem: dict[str, Any]) -> dict[str, Any]:
    return {"tensors": mem["tensors_bytes"], "reserved": mem["reserved_bytes"]}


def _run_config(plan: Plan, tmp: str) -> Any:
    from orchestrator.trainer.loop import RunConfig
    from predictor.memory_spec import parse_memory_spec

    req = parse_memory_spec(plan.spec())  # the model and the plan; no GPU type needed
    return RunConfig(job_id="trainer-cuda", model=req.model, global_batch=plan.global_batch,
                     seq_len=plan.seq_len, total_steps=STEPS, tp=plan.tp, dp=plan.dp,
                     pp=plan.pp, micro_batch=plan.micro_batch, recompute=req.par.recompute,
                     zero_stage=req.par.zero_stage, precision=req.train.precision,
                     optimizer=req.train.optimizer,
                     checkpoint_dir=tmp, checkpoint_every=10**9)


def _site(frames: list[dict[str, Any]]) -> str:
    """The innermost frame of this repository's code in an allocation's Python stack."""
    for f in frames:
        name = f.get("filename", "")
        if "/orchestrator/" in name or "/benchmarks/" in name:
            return f"{name.split('/')[-2]}/{name.split('/')[-1]}:{f.get('line')} {f.get('name')}"
    return frames[0].get("name", "?") if frames else "?"


def peak_contents(snapshot: dict[str, Any], top: int = 40,
                  site: Callable[[list[dict[str, Any]]], str] = _site) -> dict[str, Any]:
    """What was allocated at the tensor peak of a ``torch.cuda.memory._snapshot()`` whose
    history was recorded from the start: the device trace replayed twice, a block counting
    from its ``alloc`` to its ``free_completed`` (as ``max_memory_allocated`` counts it: a
    block another stream still uses stays allocated until that stream's work is done) and to
    its ``free_requested`` (when the program dropped it); the blocks alive at the first
    peak grouped by the code that allocated them and their size, and the blocks whose free
    was requested but not completed at that peak."""
    def replay(free_action: str) -> tuple[int, dict[int, tuple[int, str]], set[int]]:
        live: dict[int, tuple[int, str]] = {}
        requested: set[int] = set()
        cur = peak = 0
        at_peak: dict[int, tuple[int, str]] = {}
        pending: set[int] = set()
        for ev in (snapshot.get("device_traces") or [[]])[0]:
            if ev["action"] == "alloc":
                live[ev["addr"]] = (ev["size"], site(ev.get("frames", [])))
                requested.discard(ev["addr"])
                cur += ev["size"]
                if cur > peak:
                    peak, at_peak, pending = cur, dict(live), set(requested)
            elif ev["action"] == "free_requested":
                requested.add(ev["addr"])
            if ev["action"] == free_action and ev["addr"] in live:
                cur -= live.pop(ev["addr"])[0]
                requested.discard(ev["addr"])
        return peak, at_peak, pending

    def grouped(blocks: list[tuple[int, str]]) -> list[dict[str, Any]]:
        groups: dict[tuple[str, int], int] = {}
        for size, site in blocks:
            groups[(site, size)] = groups.get((site, size), 0) + 1
        rows = [{"site": site, "block_bytes": size, "count": n, "bytes": size * n}
                for (site, size), n in groups.items()]
        return sorted(rows, key=lambda r: -r["bytes"])[:top]

    peak, at_peak, pending = replay("free_completed")
    requested_peak = replay("free_requested")[0]
    return {"peak_bytes": peak, "peak_bytes_free_requested": requested_peak,
            "blocks": len(at_peak), "groups": grouped(list(at_peak.values())),
            "freed_not_completed": grouped([at_peak[a] for a in pending])}


def rank_run(cfg: Any, rank: int) -> dict[str, Any]:
    """``train(cfg, rank)`` with the peak statistics read and reset after every step (and on
    rank 0, with ``FRENZY_CUDA_SNAPSHOT`` set, the allocation history recorded and what was
    alive at the peak returned as ``peak_contents``)."""
    from orchestrator.trainer import loop

    loop.ckpt.save = lambda *a, **k: None  # type: ignore[assignment]
    dev = loop.pick_device()
    cuda = dev.type == "cuda"
    steps: list[dict[str, float]] = []
    last = [time.perf_counter()]

    def on_step(status: dict[str, Any]) -> None:
        if cuda:
            torch.cuda.synchronize(dev)
        now = time.perf_counter()
        row = {"s": now - last[0]}
        if cuda:
            row["alloc"] = torch.cuda.max_memory_allocated(dev)
            row["reserved"] = torch.cuda.max_memory_reserved(dev)
            # the bytes the program asked for, before the allocator rounds a request up to
            # its block (a block is not split for a remainder of 1 MiB or less)
            row["requested"] = torch.cuda.memory_stats(dev).get("requested_bytes.all.peak", 0)
            torch.cuda.reset_peak_memory_stats(dev)
        elif status.get("peak_tensors_bytes"):
            row["alloc"] = status["peak_tensors_bytes"]
        steps.append(row)
        last[0] = time.perf_counter()

    out: dict[str, Any] = {"rank": rank}
    record = cuda and rank == 0 and bool(os.environ.get("FRENZY_CUDA_SNAPSHOT"))
    if record:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=2_000_000)
    if cuda:
        torch.empty(1, device=dev)  # the peak statistics need an initialised device
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    last[0] = time.perf_counter()
    loop.train(cfg, rank, loop.Control(on_step=on_step))
    out["steps"] = steps
    if record:
        out["peak_contents"] = peak_contents(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    if cuda:
        free, total = torch.cuda.mem_get_info(dev)
        out["outside_allocator"] = (total - free) - torch.cuda.memory_reserved(dev)
        out["gpu_total"] = total
    return out


def _peaks(steps: list[dict[str, float]]) -> dict[str, Any]:
    """A rank's peaks over its measured steps."""
    out: dict[str, Any] = {
        "alloc": max(s.get("alloc", 0) for s in steps),
        "alloc_steady": max((s.get("alloc", 0) for s in steps[1:]), default=0),
        "alloc_first": steps[0].get("alloc", 0),
    }
    if "reserved" in steps[0]:
        out["reserved"] = max(s["reserved"] for s in steps)
    if steps[0].get("requested"):
        out["requested"] = max(s["requested"] for s in steps)
    return out


def measure(plan: Plan) -> dict[str, Any]:
    """Run ``plan`` on this machine; rank 0's figures, and with pipeline stages the first
    rank's of every stage (``stages``) and the largest of them (the plan's figures)."""
    from orchestrator.trainer.local import run_local

    with tempfile.TemporaryDirectory(prefix="frz-trainer-cuda-") as tmp:
        cfg = _run_config(plan, tmp)
        if cfg.world_size == 1:
            ranks = [rank_run(cfg, 0)]
        else:
            os.environ["FRENZY_DIST_BACKEND"] = "gloo"
            ranks = run_local(cfg, fn=rank_run, timeout_s=600.0)
    r0 = ranks[0]
    steps = r0["steps"]
    out = _peaks(steps)
    if plan.pp > 1:
        out["stages"] = [_peaks(ranks[i * plan.tp * plan.dp]["steps"]) for i in range(plan.pp)]
        for key in ("alloc", "reserved", "requested"):
            if key in out:
                out[key] = max(st[key] for st in out["stages"])
    if "peak_contents" in r0:
        out["peak_contents"] = r0["peak_contents"]
    if "reserved" in steps[0] and plan.world == 1:  # else the GPU holds other ranks
        out["device"] = r0["outside_allocator"] + out["reserved"]
        out["outside_allocator"] = r0["outside_allocator"]
    if plan.world == 1 and len(steps) > 2:
        out["step_s"] = statistics.median(s["s"] for s in steps[2:])
    return out


def _err(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def _errors(pred: dict[str, Any], meas: dict[str, Any]) -> dict[str, float]:
    """Signed errors in percent of every figure both sides have."""
    out = {"err_tensors_pct": _err(pred["tensors"], meas["alloc"])}
    if meas.get("requested"):
        out["err_requested_pct"] = _err(pred["tensors"], meas["requested"])
    for key, name in (("reserved", "reserved"), ("device", "device"), ("step_s", "step")):
        if key in meas:
            out[f"err_{name}_pct"] = _err(pred[key], meas[key])
    if "stages" in pred and "stages" in meas:
        pairs = zip(pred["stages"], meas["stages"], strict=True)
        out["err_stage_tensors_pct"] = [_err(p["tensors"], m["alloc"]) for p, m in pairs]
    return out


def run(plans: list[Plan], gpu: str, out_path: str | None) -> list[dict[str, Any]]:
    rows = []
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    for i, plan in enumerate(plans):
        pred = predict(plan, gpu)
        t0 = time.perf_counter()
        try:
            meas = measure(plan)
        except Exception as exc:  # one failed plan is a row, not the end
            log.exception("[%d/%d] %s failed", i + 1, len(plans), plan.label())
            row = {"plan": plan.label(), "device_name": device, "error": repr(exc)[:400]}
        else:
            row = {"plan": plan.label(), "device_name": device, "gpu": gpu,
                   "world": plan.world, "vocab_parallel": True,
                   "measured": meas, "predicted": pred,
                   **_errors(pred, meas), "seconds": round(time.perf_counter() - t0, 1)}
            log.info("[%d/%d] %s: alloc %.2f GiB (pred %+.1f %%), step %s", i + 1,
                     len(plans), plan.label(), meas["alloc"] / GIB, row["err_tensors_pct"],
                     f"{meas['step_s'] * 1e3:.1f} ms" if "step_s" in meas else "-")
        rows.append(row)
        if out_path:
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]

    def stats(key: str) -> dict[str, Any]:
        errs = [r[key] for r in ok if key in r]
        if not errs:
            return {"n": 0}
        return {"n": len(errs), "mape": statistics.fmean(abs(e) for e in errs),
                "worst": max(errs, key=abs), "bias": statistics.fmean(errs),
                "under_5pct": sum(e < -5 for e in errs)}

    # a plan the planner just fits (device figure = capacity · (1 − FIT_MARGIN)) runs out of
    # memory when the measured device figure exceeds the capacity
    from predictor.overhead import FIT_MARGIN

    dev = [r for r in ok if "device" in r["measured"]]
    oom = sum(r["predicted"]["device"] / (1.0 - FIT_MARGIN) < r["measured"]["device"]
              for r in dev)
    return {"plans": len(rows), "failed": len(rows) - len(ok),
            "device_name": rows[0]["device_name"] if rows else None,
            "tensors": stats("err_tensors_pct"), "requested": stats("err_requested_pct"),
            "reserved": stats("err_reserved_pct"),
            "device": stats("err_device_pct"), "step_time": stats("err_step_pct"),
            "fit_margin": FIT_MARGIN, "oom_after_margin": oom}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"| {'plan':<62} | alloc GiB | err % | reserved GiB | err % | device GiB | "
             "err % | step ms | err % |",
             f"|{'-' * 64}|----------:|------:|-------------:|------:|-----------:|------:|"
             "--------:|------:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['plan']:<62} | failed: {r['error'][:80]}")
            continue
        m = r["measured"]
        cells = []
        for key, err, scale, fmt in (("alloc", "err_tensors_pct", 1 / GIB, "9.2f"),
                                     ("reserved", "err_reserved_pct", 1 / GIB, "12.2f"),
                                     ("device", "err_device_pct", 1 / GIB, "10.2f"),
                                     ("step_s", "err_step_pct", 1e3, "7.1f")):
            cells.append(f"{m[key] * scale:{fmt}} | {r[err]:+5.1f}" if key in m
                         else f"{'-':>9} | {'-':>5}")
        lines.append(f"| {r['plan']:<62} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replay(paths: list[str], gpu: str = "H200") -> list[dict[str, Any]]:
    """The measured rows of earlier runs (JSON lines written by ``--out``) priced again by
    today's predictor: no GPU needed. Rows of plans no longer in ``PLANS`` are skipped;
    rows without ``vocab_parallel`` ran the replicated head and are priced so."""
    by_label = {p.label(): p for p in PLANS}
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                old = json.loads(line)
                plan = by_label.get(old["plan"])
                if plan is None or "error" in old:
                    continue
                meas = old["measured"]
                vp = bool(old.get("vocab_parallel", False))
                pred = predict(plan, old.get("gpu", gpu), vp)
                rows.append({"plan": old["plan"], "device_name": old["device_name"],
                             "gpu": old.get("gpu", gpu), "world": old["world"],
                             "vocab_parallel": vp,
                             "measured": meas, "predicted": pred, **_errors(pred, meas),
                             "source": os.path.basename(path)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--quick", action="store_true", help=f"only plans {QUICK}")
    ap.add_argument("--gpu", default="H200", help="catalog GPU type of this device")
    ap.add_argument("--out", help="append each plan's row to this JSON-lines file")
    ap.add_argument("--plans", help="comma-separated plan indices (default: all)")
    ap.add_argument("--replay", nargs="+", metavar="FILE.jsonl",
                    help="price the rows of earlier runs again (no GPU), e.g. "
                         "docs/gpu_runs/trainer_cuda_h200*.jsonl")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.replay:
        return report(replay(args.replay, args.gpu), args.json)  # (a replay has no failures)
    plans = PLANS
    if args.quick:
        plans = [PLANS[i] for i in QUICK]
    if args.plans:
        plans = [PLANS[int(i)] for i in args.plans.split(",")]
    if not torch.cuda.is_available():
        log.warning("no CUDA device: the plans run on the CPU (tensor peaks only, step times "
                    "of the CPU)")
        plans = [replace(p, global_batch=p.micro_batch * p.dp, seq_len=64) for p in plans]
    return report(run(plans, args.gpu, args.out), args.json)


def report(rows: list[dict[str, Any]], as_json: bool) -> int:
    """Print ``rows``' table and summary (``as_json``: the summary again as the last line);
    the exit status: 1 when a plan failed."""
    print(table(rows))
    s = summary(rows)
    print(json.dumps(s, indent=2))
    if as_json:
        print(json.dumps(s))
    return 0 if s["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
