"""The caching allocator's reserve under variable-length data, measured with Hugging Face's Trainer.

    python -m benchmarks.hf_fragmentation --predict            # the predictions alone
    python -m benchmarks.hf_fragmentation [--variants var2048,fix2048] [--out FILE.jsonl]
    python -m benchmarks.hf_fragmentation --json --replay docs/gpu_runs/hf_fragmentation_h200.jsonl

The public ms-swift rows (``../shared/measurements/real_memory/ms_swift.csv``) read
``max_memory_reserved`` of a Qwen-1.8B full fine-tune (model loaded in bf16, the Trainer's
bf16, gradient checkpointing, batch 1, 16 accumulation steps) on a dataset whose samples
vary in length (3234 ± 2548 tokens, 91 to 19548, truncated at ``--max_length``). Their
reserve is up to 17 GiB above the tensors the ``hf-trainer`` profile counts, and not
monotonic in the length. This runs the same job on this machine's GPU, ``VARIANTS`` of it,
each in its own process (a fresh allocator; ``PYTORCH_CUDA_ALLOC_CONF`` set before CUDA
starts): lengths drawn from the dataset's stated spread (a normal clipped to its range, a
seeded draw) or every sample at the full length, with the allocator's default or with
``expandable_segments``. A row holds the peaks (``max_memory_allocated``, ``_reserved``), the
reserve after every optimizer step, and what ``frenzy memory`` predicts for the job at its
full length.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from benchmarks.hf_trainer_cuda import GIB, _decoder, _peaks, _plan, hf_model, predict
from benchmarks.trainer_cuda import _errors

log = logging.getLogger("benchmarks.hf_fragmentation")

QWEN_18B = _decoder("qwen2", 24, 2048, 16, 16, 5504, 151936, 32768, tie_word_embeddings=False)
"""Qwen v1 1.8B in the qwen2 layout: the dimensions of the ms-swift rows (qkv bias, SwiGLU
branches of 5504, untied output layer)."""

LENGTH_MEAN, LENGTH_SD, LENGTH_MIN, LENGTH_MAX = 3234, 2548, 91, 19548
"""cls-fudan-news-zh's token lengths as the ms-swift benchmark states them."""

ACCUMULATE = 16
VARIANTS: dict[str, dict[str, Any]] = {
    "var2048": {"seq_len": 2048, "lengths": "variable", "alloc_conf": ""},
    "var2048x": {"seq_len": 2048, "lengths": "variable",
                 "alloc_conf": "expandable_segments:True"},
    "fix2048": {"seq_len": 2048, "lengths": "fixed", "alloc_conf": ""},
    "var4096": {"seq_len": 4096, "lengths": "variable", "alloc_conf": ""},
    "var4096x": {"seq_len": 4096, "lengths": "variable",
                 "alloc_conf": "expandable_segments:True"},
    "fix4096": {"seq_len": 4096, "lengths": "fixed", "alloc_conf": ""},
    "var8192": {"seq_len": 8192, "lengths": "variable", "alloc_conf": ""},
}


def spec_for(seq_len: int) -> dict[str, Any]:
    """The ``frenzy memory`` spec of the job at ``seq_len`` tokens on the H200."""
    spec = _plan(QWEN_18B, seq_len, 1, recompute="full", accumulate=ACCUMULATE)
    spec["runtime_options"] = {"pure_low_precision": True}
    return spec


def lengths(n: int, max_len: int, variable: bool, seed: int = 0) -> list[int]:
    """``n`` sample lengths: the dataset's spread truncated at ``max_len``, or all ``max_len``."""
    if not variable:
        return [max_len] * n
    g = torch.Generator().manual_seed(seed)
    drawn = torch.normal(float(LENGTH_MEAN), float(LENGTH_SD), (n,), generator=g)
    return [min(max_len, int(x)) for x in drawn.round().clamp(LENGTH_MIN, LENGTH_MAX)]


class _Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token ids, one sample per given length, as inputs and labels."""

    def __init__(self, sizes: list[int], vocab: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = [torch.randint(0, vocab, (n,), generator=g) for n in sizes]

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def measure_one(name: str, micro_batches: int) -> dict[str, Any]:
    """Run variant ``name`` in this process (its allocator setting already in the
    environment): the peaks, and the reserve after each optimizer step."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    var = VARIANTS[name]
    model = hf_model(spec_for(var["seq_len"]), "cuda", dtype=torch.bfloat16)
    sizes = lengths(micro_batches, var["seq_len"], var["lengths"] == "variable")
    data = _Samples(sizes, model.config.vocab_size)
    trajectory: list[dict[str, float]] = []
    started = time.perf_counter()

    class Track(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, _args: Any, state: Any, *_: Any, **__: Any) -> None:
            trajectory.append({"step": state.global_step,
                               "reserved_gib": torch.cuda.memory_reserved() / GIB,
                               "max_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
                               "max_alloc_gib": torch.cuda.max_memory_allocated() / GIB,
                               "s": round(time.perf_counter() - started, 1)})
            log.info("%s step %d: reserved %.2f GiB (peak %.2f), tensors peak %.2f",
                     name, state.global_step, *(trajectory[-1][k] for k in
                                                ("reserved_gib", "max_reserved_gib",
                                                 "max_alloc_gib")))

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=1,
            gradient_accumulation_steps=ACCUMULATE, max_steps=micro_batches // ACCUMULATE,
            bf16=True, gradient_checkpointing=True, optim="adamw_torch", learning_rate=1e-5,
            report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Track()])
        torch.cuda.reset_peak_memory_stats()
        trainer.train()
        out = _peaks(model)
    return {"variant": name, **var, "device_name": torch.cuda.get_device_name(0),
            "micro_batches": micro_batches,
            "tokens_mean": sum(sizes) / len(sizes),
            "share_at_max": sum(s == var["seq_len"] for s in sizes) / len(sizes),
            "measured": out, "trajectory": trajectory,
            "seconds": round(time.perf_counter() - started, 1)}


def run(names: list[str], micro_batches: int, out_path: str | None) -> list[dict[str, Any]]:
    """Each variant in a child process (this one never starts CUDA, so the device figure
    counts the child alone); a failed one is a row with its error."""
    import transformers

    rows = []
    for name in names:
        var = VARIANTS[name]
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": var["alloc_conf"]}
        with tempfile.NamedTemporaryFile(suffix=".json") as res:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.hf_fragmentation", "--one", name,
                 "--micro-batches", str(micro_batches), "--result", res.name],
                env=env, check=False)
            with open(res.name) as f:
                got = json.load(f) if os.path.getsize(res.name) else None
        spec = spec_for(var["seq_len"])
        pred = predict(spec)
        row = {"torch": torch.__version__,
               "transformers": transformers.__version__, "spec": spec,
               "predicted": {k: v for k, v in pred.items() if k != "breakdown"},
               **(got or {"variant": name, "error": f"exit {proc.returncode}"})}
        rows.append(row)
        if out_path:
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def replay(path: str) -> list[dict[str, Any]]:
    """The measured rows of an earlier run, priced by today's predictor (no GPU needed)."""
    rows = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "error" not in row:
                pred = predict(row["spec"])
                row["predicted"] = {k: v for k, v in pred.items() if k != "breakdown"}
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> None:
    """Measured peaks (GiB) against the prediction, per variant."""
    print(f"{'variant':<10} {'allocator':<10} {'mean tok':>8} {'tensors':>8} {'reserved':>9} "
          f"{'res/ten':>7} {'pred ten':>8} {'err':>6} {'pred res':>8} {'err':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<10} {r['error']}")
            continue
        m, p = r["measured"], r["predicted"]
        e = _errors(p, m)
        print(f"{r['variant']:<10} {'expand' if r['alloc_conf'] else 'default':<10} "
              f"{r['tokens_mean']:8.0f} {m['alloc'] / GIB:8.2f} {m['reserved'] / GIB:9.2f} "
              f"{m['reserved'] / m['alloc']:7.3f} {p['tensors'] / GIB:8.2f} "
              f"{e['err_tensors_pct']:+6.1f} {p['reserved'] / GIB:8.2f} "
              f"{e['err_reserved_pct']:+6.1f}")


def as_json(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: the measured peaks (GiB), their ratio and the prediction's errors (%)."""
    out = {}
    for r in rows:
        if "error" in r:
            out[r["variant"]] = {"error": r["error"]}
            continue
        m, p = r["measured"], r["predicted"]
        e = _errors(p, m)
        out[r["variant"]] = {
            "allocator": r["alloc_conf"] or "default", "lengths": r["lengths"],
            "tensors_gib": round(m["alloc"] / GIB, 3),
            "reserved_gib": round(m["reserved"] / GIB, 3),
            "reserved_over_tensors": round(m["reserved"] / m["alloc"], 4),
            "err_tensors_pct": round(e["err_tensors_pct"], 2),
            "err_reserved_pct": round(e["err_reserved_pct"], 2)}
    return {"variants": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--micro-batches", type=int, default=320)
    ap.add_argument("--out", help="append each variant's row to this JSON-lines file")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--predict", action="store_true", help="the predictions only (no GPU)")
    ap.add_argument("--replay", metavar="FILE.jsonl",
                    help="price an earlier run's rows again (no GPU needed)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if args.predict:
        for n in names:
            p = predict(spec_for(VARIANTS[n]["seq_len"]))
            print(f"{n:<10} tensors {p['tensors'] / GIB:6.2f} GiB  reserved "
                  f"{p['reserved'] / GIB:6.2f}  device {p['device'] / GIB:6.2f}")
        return 0
    if args.replay:
        rows = replay(args.replay)
    elif not torch.cuda.is_available():
        log.error("no CUDA device: this benchmark measures a GPU (--predict and --replay "
                  "need none)")
        return 2
    elif args.one:  # a child of ``run``: one variant, its row to --result
        with open(args.result, "w") as f:
            json.dump(measure_one(args.one, args.micro_batches), f)
        return 0
    else:
        rows = run(names, args.micro_batches, args.out)
    table(rows)
    if args.json:
        print(json.dumps(as_json(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
