"""Hugging Face's Trainer on a real GPU: measured peak memory against the ``hf-trainer`` profile.

    python -m benchmarks.hf_trainer_cuda --predict [--json]        # the predictions alone
    python -m benchmarks.hf_trainer_cuda [--plans 0,3] [--out FILE.jsonl] [--json]   # on CUDA
    python -m benchmarks.hf_trainer_cuda --replay docs/gpu_runs/hf_trainer_h200.jsonl [--json]

The ground truth here is code this project did not write: each plan is one ``frenzy memory``
spec (a Hugging Face ``config.json`` object, the training config, ``runtime: hf-trainer``), and
on the GPU it runs ``transformers.Trainer`` on the model ``AutoModelForCausalLM.from_config``
builds from that same config (random weights, fp32 parameters as ``from_config`` makes them,
the default attention implementation, synthetic token ids as inputs and labels) for
``STEPS`` optimizer steps: ``bf16=True`` for bf16 plans, ``gradient_checkpointing`` for
``recompute: full``, the spec's ``optimizer`` as ``optim``, ``micro_batch`` per device and
``global_batch / (micro_batch · dp)`` accumulation steps. A plan with ``dp`` > 1 runs as that
many processes sharing the one GPU (torch DDP over gloo; rank 0 measured, no device
figure); a plan with ``runtime: lightning`` runs the same model under PyTorch Lightning.

Measured over the whole run (peak statistics reset once the model is built):
``torch.cuda.max_memory_allocated`` (tensors), ``max_memory_reserved`` (the allocator's
segments), and ``device``: the process's use outside the allocator (``mem_get_info`` used
minus reserved, at the end, while the cache still holds its segments) plus the reserved peak.
Step time (``step_time_s``, against the ``hf-trainer`` step profile's ``step_s``) is the
median over steps 3 on (synchronised at each step's end).
Plans run one after the other in this process, the cache emptied between them.

A plan whose device figure exceeds the prediction divided by ``1 − FIT_MARGIN`` would run
out of memory on a GPU the planner had just filled: the summary's ``oom_after_margin``.
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
from pathlib import Path
from typing import Any

import torch

from benchmarks.trainer_cuda import _errors, report, summary

log = logging.getLogger("benchmarks.hf_trainer_cuda")
GIB = 1 << 30
STEPS = 6

# config.json objects as the Hub publishes them (the fields that size the model)
GPT2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
        "vocab_size": 50257, "n_positions": 1024}
GPT2_MEDIUM = {**GPT2, "n_layer": 24, "n_embd": 1024, "n_head": 16}
OPT_125M = {"model_type": "opt", "num_hidden_layers": 12, "hidden_size": 768,
            "num_attention_heads": 12, "ffn_dim": 3072, "vocab_size": 50272,
            "max_position_embeddings": 2048, "word_embed_proj_dim": 768,
            "do_layer_norm_before": True, "activation_function": "relu", "dropout": 0.1,
            "attention_dropout": 0.0}
def _decoder(model_type: str, layers: int, hidden: int, heads: int, kv_heads: int,
             ffn: int, vocab: int, positions: int, **extra: Any) -> dict[str, Any]:
    """A llama-layout ``config.json`` object (llama, qwen2, qwen3, gemma, phi3)."""
    return {"model_type": model_type, "num_hidden_layers": layers, "hidden_size": hidden,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": positions, **extra}


QWEN2_05B = _decoder("qwen2", 24, 896, 14, 2, 4864, 151936, 32768, tie_word_embeddings=True)
QWEN3_06B = _decoder("qwen3", 28, 1024, 16, 8, 3072, 151936, 40960, head_dim=128,
                     tie_word_embeddings=True)
TINYLLAMA = _decoder("llama", 22, 2048, 32, 4, 5632, 32000, 2048, tie_word_embeddings=False)
GEMMA_2B = _decoder("gemma", 18, 2048, 8, 1, 16384, 256000, 8192, head_dim=256,
                    hidden_activation="gelu_pytorch_tanh")
PHI3_MINI = _decoder("phi3", 32, 3072, 32, 32, 8192, 32064, 4096, tie_word_embeddings=False)


def _plan(cfg: dict[str, Any], seq_len: int, micro_batch: int, precision: str = "bf16",
          recompute: str = "none", optimizer: str = "adamw_torch", accumulate: int = 1,
          dp: int = 1) -> dict[str, Any]:
    return {"hf_config": cfg, "global_batch": micro_batch * accumulate * dp,
            "seq_len": seq_len, "micro_batch": micro_batch, "precision": precision,
            "recompute": recompute, "optimizer": optimizer, "runtime": "hf-trainer",
            "gpu": "H200", **({"dp": dp} if dp > 1 else {})}


def _added(plans: list[dict[str, Any]]) -> range:
    """Append ``plans`` to ``PLANS``; their indices there."""
    start = len(PLANS)
    PLANS.extend(plans)
    return range(start, len(PLANS))


PLANS: list[dict[str, Any]] = []
TUNING = _added([
    _plan(GPT2, 1024, 8),
    _plan(GPT2, 1024, 8, recompute="full"),
    _plan(GPT2, 1024, 4, precision="fp32"),
    _plan(GPT2_MEDIUM, 1024, 8),
    _plan(GPT2_MEDIUM, 1024, 8, recompute="full", accumulate=2),
    _plan(OPT_125M, 2048, 4),
    _plan(QWEN2_05B, 2048, 4),
    _plan(QWEN2_05B, 2048, 8, recompute="full"),
    _plan(QWEN2_05B, 1024, 4, precision="fp32"),
    _plan(QWEN3_06B, 2048, 4),
    _plan(QWEN3_06B, 2048, 8, recompute="full", optimizer="adamw_torch_fused"),
    _plan(TINYLLAMA, 2048, 4),
    _plan(TINYLLAMA, 2048, 16, recompute="full"),
    _plan(TINYLLAMA, 2048, 2, optimizer="adamw_torch_fused"),
    _plan(GEMMA_2B, 1024, 4),
    _plan(GEMMA_2B, 2048, 4, recompute="full"),
    _plan(PHI3_MINI, 2048, 1),
    _plan(PHI3_MINI, 4096, 2, recompute="full"),
])
"""The first run's plans: measured before the profile's Hugging Face terms were written, and
looked at to find them (docs/trainer_cuda.md). The plans after them were added with those
terms committed, and measured once: the held-out check."""

LLAMA32_1B = _decoder("llama", 16, 2048, 32, 8, 8192, 128256, 131072, head_dim=64,
                      tie_word_embeddings=True)
SMOLLM2_360M = _decoder("llama", 32, 960, 15, 5, 2560, 49152, 8192, tie_word_embeddings=True)
PYTHIA_410M = {"model_type": "gpt_neox", "num_hidden_layers": 24, "hidden_size": 1024,
               "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 50304,
               "max_position_embeddings": 2048, "rotary_pct": 0.25,
               "use_parallel_residual": True, "tie_word_embeddings": False}
GPT2_LARGE = {**GPT2, "n_layer": 36, "n_embd": 1280, "n_head": 20}
QWEN25_15B = _decoder("qwen2", 28, 1536, 12, 2, 8960, 151936, 32768, tie_word_embeddings=True)
QWEN3_17B = _decoder("qwen3", 28, 2048, 16, 8, 6144, 151936, 40960, head_dim=128,
                     tie_word_embeddings=True)

HOLDOUT = _added([
    _plan(LLAMA32_1B, 2048, 4),
    _plan(LLAMA32_1B, 2048, 8, recompute="full"),
    _plan(LLAMA32_1B, 1024, 2, precision="fp32"),
    _plan(SMOLLM2_360M, 2048, 8),
    _plan(PYTHIA_410M, 2048, 8),
    _plan(PYTHIA_410M, 1024, 4, precision="fp32"),
    _plan(GPT2_LARGE, 1024, 4),
    _plan(GPT2_LARGE, 1024, 4, precision="fp32", recompute="full"),
    _plan(QWEN25_15B, 2048, 4),
    _plan(QWEN25_15B, 4096, 8, recompute="full"),
    _plan(QWEN3_17B, 2048, 4, optimizer="adamw_torch_fused"),
    _plan(PHI3_MINI, 1024, 1, precision="fp32", recompute="full"),
    _plan(GEMMA_2B, 1024, 2, accumulate=2),
    _plan(GPT2, 1024, 4, accumulate=4),
    _plan(OPT_125M, 2048, 4, precision="fp32"),
])
# data parallel: torch DDP over gloo, two ranks sharing the one GPU (rank 0 measured),
# added with the profile unchanged since the held-out run and measured once
DATA_PARALLEL = _added([
    _plan(GPT2, 1024, 8, dp=2),
    _plan(QWEN2_05B, 2048, 4, dp=2),
    _plan(TINYLLAMA, 2048, 2, dp=2, recompute="full"),
    _plan(GPT2_MEDIUM, 1024, 4, dp=2, accumulate=2),
])
# PyTorch Lightning running the same models (the predictor reads "lightning" as hf-trainer),
# added with the profile unchanged since the data-parallel run and measured once
LIGHTNING = _added([
    {**_plan(GPT2, 1024, 8), "runtime": "lightning"},
    {**_plan(QWEN2_05B, 2048, 4), "runtime": "lightning"},
    {**_plan(TINYLLAMA, 2048, 4, recompute="full"), "runtime": "lightning"},
])
# more held-out Trainer plans: fp16 AMP (GradScaler), transformers' Adafactor, 8k tokens,
# fp32 GQA attention of another model, added with the profile unchanged and measured once
MORE = _added([
    _plan(TINYLLAMA, 2048, 4, precision="fp16"),
    _plan(QWEN2_05B, 2048, 4, optimizer="adafactor"),
    _plan(QWEN2_05B, 8192, 1, recompute="full"),
    _plan(QWEN3_06B, 2048, 1, precision="fp32"),
    _plan(GPT2_MEDIUM, 1024, 4, precision="fp16", accumulate=4),
    _plan(LLAMA32_1B, 4096, 2, recompute="full", optimizer="adamw_torch_fused"),
])
QUICK = [0, 6, 11]


def label(spec: dict[str, Any]) -> str:
    cfg = spec["hf_config"]
    size = cfg.get("hidden_size", cfg.get("n_embd"))
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    dp = f" dp{spec['dp']}" if spec.get("dp", 1) > 1 else ""
    dp += " lightning" if spec["runtime"] == "lightning" else ""
    return (f"{cfg['model_type']} L{layers} h{size} s{spec['seq_len']} "
            f"B{spec['global_batch']} mb{spec['micro_batch']}{dp} {spec['precision']} "
            f"rc={spec['recompute']} {spec['optimizer']}")


def predict(spec: dict[str, Any]) -> dict[str, Any]:
    """What ``frenzy memory`` says for ``spec``, and the step time the planner prices for it
    (the ``hf-trainer`` step profile; Adafactor at the model's generic optimizer figure)."""
    from predictor.memory_spec import memory_report, parse_memory_spec
    from predictor.step_time import estimate_step_time

    mem = memory_report(spec)
    req = parse_memory_spec(spec)
    step = estimate_step_time(req.model, req.train, req.par, req.gpu, runtime="hf-trainer")
    return {"tensors": mem["tensors_bytes"], "reserved": mem["reserved_bytes"],
            "device": mem["device_bytes"], "step_s": step.total_s,
            "breakdown": mem["breakdown"]}


def _errors_of(pred: dict[str, Any], meas: dict[str, Any]) -> dict[str, Any]:
    """``_errors`` with the measured step time (``step_time_s``: the median over steps 3 on)
    against the predicted one; Lightning's and data-parallel rows record none."""
    if "step_time_s" in meas:
        meas = {**meas, "step_s": meas["step_time_s"]}
    return _errors(pred, meas)


def hf_model(spec: dict[str, Any], device: str | torch.device,
             dtype: torch.dtype | None = None) -> Any:
    """The model ``transformers`` builds from the spec's config, on ``device`` (its
    parameters in ``dtype`` where given, else as ``from_config`` makes them: fp32)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(spec["hf_config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, **({} if dtype is None
                                                           else {"dtype": dtype}))


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token ids of one length, as inputs and labels (the model shifts them)."""

    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_site(frames: list[dict[str, Any]]) -> str:
    """The innermost frame of transformers' or torch's Python code in an allocation's stack
    (the modeling line that made the tensor, or the autograd / optimizer call)."""
    for f in frames:
        name = f.get("filename", "")
        for root in ("/transformers/", "/torch/"):
            if root in name and not name.endswith(("/memory.py", "/_tensor.py")):
                return f"{root.strip('/')}:{name.split(root)[-1]}:{f.get('line')} {f.get('name')}"
    return frames[0].get("name", "?") if frames else "?"


def _peaks(model: Any) -> dict[str, Any]:
    """The run's peaks (reset before it): tensors, the allocator's reserve, the process's
    use outside the allocator (read now, while the cache still holds its segments) and the
    device figure nvidia-smi would read at the peak; the model's parameter count."""
    out: dict[str, Any] = {"alloc": torch.cuda.max_memory_allocated(),
                           "reserved": torch.cuda.max_memory_reserved()}
    free, total = torch.cuda.mem_get_info()
    out["outside_allocator"] = (total - free) - torch.cuda.memory_reserved()
    out["device"] = out["outside_allocator"] + out["reserved"]
    out["params"] = sum(p.numel() for p in model.parameters())
    return out


def measure(spec: dict[str, Any], steps: int = STEPS, contents: bool = False
            ) -> dict[str, Any]:
    """Run ``transformers.Trainer`` for ``spec`` on this machine's CUDA device (its ``dp``
    ranks through ``_measure_ddp``; Lightning for ``runtime: lightning``); with
    ``contents``, the allocator's history too, and what was allocated at the peak."""
    dp = spec.get("dp", 1)
    if dp > 1 and "RANK" not in os.environ:
        return _measure_ddp(spec, steps)
    if spec["runtime"] == "lightning":
        return _measure_lightning(spec, steps)
    from transformers import Trainer, TrainerCallback, TrainingArguments

    gc.collect()
    torch.cuda.empty_cache()
    model = hf_model(spec, "cuda")
    vocab = model.config.vocab_size
    accumulate = spec["global_batch"] // (spec["micro_batch"] * dp)
    data = _Tokens(spec["global_batch"] * steps, spec["seq_len"], vocab)
    ends: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *_: Any, **__: Any) -> None:
            torch.cuda.synchronize()
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=spec["micro_batch"],
            gradient_accumulation_steps=accumulate, max_steps=steps,
            bf16=spec["precision"] == "bf16", fp16=spec["precision"] == "fp16",
            gradient_checkpointing=spec["recompute"] == "full",
            optim=spec["optimizer"], learning_rate=1e-5, report_to="none",
            save_strategy="no", logging_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0, seed=0,
            **({"ddp_backend": "gloo"} if dp > 1 else {}))
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Clock()])
        torch.cuda.reset_peak_memory_stats()
        if contents:
            torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        start = time.perf_counter()
        trainer.train()
        if contents:
            from benchmarks.trainer_cuda import peak_contents

            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
        out = _peaks(model)
        out["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        if contents:
            out["peak_contents"] = peak_contents(snap, site=_hf_site)
    times = [b - a for a, b in zip([start, *ends], ends, strict=False)]
    if len(times) > 2:
        out["step_time_s"] = statistics.median(times[2:])  # the committed rows name it so
    del trainer, model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _measure_lightning(spec: dict[str, Any], steps: int) -> dict[str, Any]:
    """The same model under PyTorch Lightning (``runtime: lightning``, which the predictor
    reads as ``hf-trainer``): a LightningModule whose step returns the model's loss,
    ``torch.optim.AdamW`` (foreach) from ``configure_optimizers``, ``precision`` as
    Lightning spells it, the model's gradient checkpointing for ``recompute: full``."""
    import lightning as L

    gc.collect()
    torch.cuda.empty_cache()
    model = hf_model(spec, "cuda")
    if spec["recompute"] == "full":
        model.gradient_checkpointing_enable()
    model.train()

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self, net: Any) -> None:
            super().__init__()
            self.model = net

        def training_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-5)

    accumulate = spec["global_batch"] // spec["micro_batch"]
    data = torch.utils.data.DataLoader(
        _Tokens(spec["global_batch"] * steps, spec["seq_len"], model.config.vocab_size),
        batch_size=spec["micro_batch"])
    trainer = L.Trainer(accelerator="gpu", devices=1, max_steps=steps,
                        precision="bf16-mixed" if spec["precision"] == "bf16" else "32-true",
                        accumulate_grad_batches=accumulate, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    torch.cuda.reset_peak_memory_stats()
    trainer.fit(Module(model), data)
    out = _peaks(model)
    del trainer, model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _ddp_rank(rank: int, spec: dict[str, Any], steps: int, port: int, out: str) -> None:
    """One data-parallel rank of ``_measure_ddp`` (a spawned process)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(spec["dp"]), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    got = measure(spec, steps)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(got, f)


def _measure_ddp(spec: dict[str, Any], steps: int) -> dict[str, Any]:
    """``spec``'s ``dp`` ranks as processes sharing this one GPU (each sees it as its local
    device 0; torch DDP over gloo, since NCCL refuses two ranks on one device): rank 0's
    tensor and reserved peaks. Its device figure is not the plan's (the device's use counts
    every rank) and is dropped."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.start_processes(_ddp_rank, args=(spec, steps, port, out), nprocs=spec["dp"],
                           start_method="spawn")
        with open(out) as f:
            got = json.load(f)
    for key in ("device", "outside_allocator", "step_time_s"):
        got.pop(key, None)
    return got


def run(plans: list[dict[str, Any]], out_path: str | None, contents: bool = False
        ) -> list[dict[str, Any]]:
    import transformers

    rows = []
    device = torch.cuda.get_device_name(0)
    for i, spec in enumerate(plans):
        pred = predict(spec)
        t0 = time.perf_counter()
        base = {"plan": label(spec), "spec": spec, "device_name": device, "gpu": spec["gpu"],
                "world": spec.get("dp", 1), "transformers": transformers.__version__,
                "torch": torch.__version__,
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        try:
            meas = measure(spec, contents=contents)
        except Exception as exc:  # one failed plan is a row, not the end
            log.exception("[%d/%d] %s failed", i + 1, len(plans), label(spec))
            row = {**base, "error": repr(exc)[:400]}
            gc.collect()
            torch.cuda.empty_cache()
        else:
            row = {**base, "measured": meas, "predicted": pred, **_errors_of(pred, meas),
                   "seconds": round(time.perf_counter() - t0, 1)}
            log.info("[%d/%d] %s: alloc %.2f GiB (pred %+.1f %%), reserved %.2f GiB (%+.1f %%)",
                     i + 1, len(plans), label(spec), meas["alloc"] / GIB,
                     row["err_tensors_pct"], meas["reserved"] / GIB, row["err_reserved_pct"])
        rows.append(row)
        if out_path:
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def replay(paths: list[str]) -> list[dict[str, Any]]:
    """Measured rows of earlier runs priced by today's predictor (no GPU needed)."""
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                old = json.loads(line)
                if "error" in old:
                    continue
                pred = predict(old["spec"])
                rows.append({**{k: old[k] for k in ("plan", "spec", "device_name", "gpu",
                                                    "world", "measured")},
                             "predicted": pred, **_errors_of(pred, old["measured"]),
                             "source": os.path.basename(path)})
    return rows


GPU_RUNS = Path(__file__).parents[1] / "docs" / "gpu_runs"
COMMITTED_ROWS = [str(GPU_RUNS / "hf_trainer_h200.jsonl"),
                  str(GPU_RUNS / "hf_trainer_h200_holdout.jsonl"),
                  str(GPU_RUNS / "hf_trainer_h200_dp.jsonl"),
                  str(GPU_RUNS / "hf_trainer_h200_lightning.jsonl"),
                  str(GPU_RUNS / "hf_trainer_h200_more.jsonl")]
"""The measured rows: the first run (the tuning plans), the held-out run, the
data-parallel run and the Lightning run (held out too: their predictions were committed
before they ran). (The
``--contents`` rerun of four tuning plans, ``hf_trainer_h200_contents.jsonl``, repeats
their peaks and is not counted twice.)"""


def committed_summary() -> dict[str, Any]:
    """``summary`` of the committed rows priced by today's predictor, per split: the tuning
    plans, the held-out Trainer plans (data-parallel ones included), the data-parallel
    ones alone and the Lightning ones."""
    rows = replay([p for p in COMMITTED_ROWS if os.path.exists(p)])
    tuning = {label(PLANS[i]) for i in TUNING}
    parallel = {label(PLANS[i]) for i in DATA_PARALLEL}
    lightning = {label(PLANS[i]) for i in LIGHTNING}
    out = {}
    for split, keep in (("tuning", lambda r: r["plan"] in tuning),
                        ("holdout", lambda r: r["plan"] not in tuning | lightning),
                        ("data_parallel", lambda r: r["plan"] in parallel),
                        ("lightning", lambda r: r["plan"] in lightning)):
        chosen = [r for r in rows if keep(r)]
        if chosen:
            out[split] = summary(chosen)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--quick", action="store_true", help=f"only plans {QUICK}")
    ap.add_argument("--plans", help="comma-separated plan indices (default: all)")
    ap.add_argument("--out", help="append each plan's row to this JSON-lines file")
    ap.add_argument("--contents", action="store_true",
                    help="record the allocator's history: what was allocated at the peak")
    ap.add_argument("--predict", action="store_true",
                    help="print each plan's prediction only (no GPU needed)")
    ap.add_argument("--replay", nargs="+", metavar="FILE.jsonl",
                    help="price the rows of earlier runs again (no GPU needed)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    plans = PLANS
    if args.quick:
        plans = [PLANS[i] for i in QUICK]
    if args.plans:
        plans = [PLANS[int(i)] for i in args.plans.split(",")]
    if args.predict:
        preds = [{"plan": label(s), **{k: v for k, v in predict(s).items()
                                       if k != "breakdown"}} for s in plans]
        for p in preds:
            print(f"{p['plan']:<70} tensors {p['tensors'] / GIB:7.2f} GiB  reserved "
                  f"{p['reserved'] / GIB:7.2f}  device {p['device'] / GIB:7.2f}")
        if args.json:
            print(json.dumps({"plans": preds}))
        return 0
    if args.replay:
        rows = replay(args.replay)
    else:
        if not torch.cuda.is_available():
            log.error("no CUDA device: this benchmark measures a GPU (--predict and "
                      "--replay need none)")
            return 2
        rows = run(plans, args.out, args.contents)
    return report(rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
