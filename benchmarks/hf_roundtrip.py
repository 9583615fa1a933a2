"""Hugging Face round trip and exact resume of the built-in trainer, on a real text corpus.

Corpus: the repository's own documentation (``README.md`` and ``docs/*.md``, ~100 KB of
English), tokenized by a byte-level BPE ``tokenizer.json`` trained on it with the
``tokenizers`` library (nothing is downloaded). Then:

* per family (gpt2, llama, qwen2, qwen3, gpt_neox, bert): a tiny model trains ``--steps`` steps on
  the corpus, is exported with ``export_hf`` and loaded with ``transformers``
  (``AutoModelForCausalLM``; ``AutoModelForMaskedLM`` too for bert); its logits are compared
  with the trainer's. The reverse: a ``transformers`` model built from a config with the
  family's own constants (rope theta, partial rotary, exact GeLU, norm eps), saved with
  ``save_pretrained``, starts a job with ``init_from``; logits compared again. A family is ok
  when both differences are below 1e-4;
* kill and resume: a 2-rank (dp=2) job on the corpus runs in its own process group, which is
  SIGKILLed once a checkpoint past a third of the steps exists; a new launch resumes from it.
  ``resume_bit_exact`` is true when its losses equal those of an uninterrupted run from the
  same step on, bit for bit, and so do the final weights.

Usage: ``python -m benchmarks.hf_roundtrip [--steps 4] [--resume-steps 30] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.data import DataConfig
from orchestrator.trainer.export import export_hf
from orchestrator.trainer.hf import hf_config, spec_from_folder
from orchestrator.trainer.local import run_local
from orchestrator.trainer.loop import RunConfig, full_state, init_from_folder, train
from orchestrator.trainer.model import Numerics, ParallelTransformer
from orchestrator.trainer.parallel import Layout
from predictor.spec import Family, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 512
TOL = 1e-4
SPECS = {
    "gpt2": ModelSpec("tiny-gpt2", Family.GPT2, 2, 64, 4, VOCAB, 128),
    "llama": ModelSpec("tiny-llama", Family.LLAMA, 2, 64, 4, VOCAB, 128, num_kv_heads=2,
                       ffn_hidden_size=128, tie_embeddings=False),
    "qwen2": ModelSpec("tiny-qwen2", Family.QWEN2, 2, 64, 4, VOCAB, 128, num_kv_heads=2,
                       ffn_hidden_size=128, tie_embeddings=True),
    # heads of 32 over hidden 64 (Q 128 wide, as Qwen3-0.6B's 16 x 128 over 1024), q/k norms
    "qwen3": ModelSpec("tiny-qwen3", Family.QWEN3, 2, 64, 4, VOCAB, 128, num_kv_heads=2,
                       ffn_hidden_size=128, tie_embeddings=True, explicit_head_dim=32),
    "gpt_neox": ModelSpec("tiny-neox", Family.GPT_NEOX, 2, 64, 4, VOCAB, 128,
                          tie_embeddings=False),
    "bert": ModelSpec("tiny-bert", Family.BERT, 2, 64, 4, VOCAB, 128, type_vocab_size=2),
}
NATIVE = {
    "gpt2": {"activation_function": "gelu_new", "layer_norm_epsilon": 1e-5},
    "llama": {"rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    "qwen2": {"rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "qwen3": {"rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
    "gpt_neox": {"hidden_act": "gelu", "rotary_pct": 0.25,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                     "partial_rotary_factor": 0.25}},
    "bert": {"hidden_act": "gelu", "layer_norm_eps": 1e-12},
}


def build_corpus(work: Path) -> tuple[Path, Path]:
    """(corpus folder, tokenizer.json): the repository's docs and a BPE trained on them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = work / "corpus"
    corpus.mkdir(parents=True)
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        shutil.copyfile(f, corpus / f"{f.parent.name}-{f.stem}.txt")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>", "[MASK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(f) for f in sorted(corpus.iterdir())], trainer=trainer)
    path = work / "tokenizer" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return corpus, path


def _auto(family: str, masked: bool = False) -> Any:
    import transformers

    if masked:
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModelForCausalLM


def _logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out = model(input_ids=tokens) if not isinstance(model, ParallelTransformer) \
            else model(tokens)
    return out.logits if hasattr(out, "logits") else out


def roundtrip(family: str, work: Path, data: DataConfig, steps: int) -> dict[str, float]:
    """Max |logit difference| out (trained → transformers) and in (transformers →
    init_from) for one family."""
    import transformers

    spec = SPECS[family]
    tokens = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    cfg = RunConfig(job_id=family, model=spec, global_batch=8, seq_len=64, total_steps=steps,
                    checkpoint_dir=str(work / "ckpt"), lr=3e-3, lr_schedule="cosine",
                    warmup_steps=1, grad_clip=1.0, data=data)
    result = train(cfg, 0)
    ours = ParallelTransformer(spec, Layout(0, 1, 1, 1))
    ours.load_state_dict(full_state(cfg))
    out = work / "export" / family
    export_hf(cfg.checkpoint_dir, family, out)
    loaded = [_auto(family).from_pretrained(out)]
    if family == "bert":
        loaded.append(_auto(family, masked=True).from_pretrained(out))
    diff_out = max(float((_logits(m, tokens) - _logits(ours, tokens)).abs().max())
                   for m in loaded)

    config = {**hf_config(spec, Numerics()), **NATIVE[family]}
    config.pop("dtype", None)
    torch.manual_seed(1)
    hf = _auto(family, masked=family == "bert").from_config(
        transformers.AutoConfig.for_model(**config))
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = work / "hf" / family
    hf.save_pretrained(folder)
    got, numerics = spec_from_folder(folder)
    mine = ParallelTransformer(got, Layout(0, 1, 1, 1), numerics=numerics)
    init_from_folder(replace(cfg, model=got, init_from=str(folder)), mine, Layout(0, 1, 1, 1))
    diff_in = float((_logits(mine, tokens) - _logits(hf, tokens)).abs().max())
    return {"diff_out": diff_out, "diff_in": diff_in, "first_loss": result.losses[0],
            "last_loss": result.losses[-1]}


def _child(cfg_path: str) -> None:
    cfg = pickle.loads(Path(cfg_path).read_bytes())
    run_local(cfg, timeout_s=600)


def kill_and_resume(work: Path, data: DataConfig, steps: int) -> dict[str, Any]:
    """Uninterrupted 2-rank run vs one killed (SIGKILL, whole process group) and resumed."""
    spec = SPECS["llama"]
    base = RunConfig(job_id="straight", model=spec, global_batch=8, seq_len=64,
                     total_steps=steps, dp=2, micro_batch=2,
                     checkpoint_dir=str(work / "resume"), checkpoint_every=max(1, steps // 6),
                     lr=3e-3, lr_schedule="cosine", warmup_steps=2, grad_clip=1.0, seed=3,
                     data=data)
    straight = run_local(base, timeout_s=600)[0]
    killed = replace(base, job_id="killed")
    cfg_file = work / "killed.pkl"
    cfg_file.write_bytes(pickle.dumps(killed))
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.hf_roundtrip", "--child",
                             str(cfg_file)], start_new_session=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    kill_after = steps // 3
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if ckpt.latest_step(killed.checkpoint_dir, "killed") >= kill_after:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    at = ckpt.latest_step(killed.checkpoint_dir, "killed")
    was_killed = proc.returncode == -signal.SIGKILL and at < steps
    resumed = run_local(killed, timeout_s=600)[0]
    tail = straight.losses[resumed.first_step:]
    a, b = full_state(base), full_state(killed)
    exact = (was_killed and resumed.losses == tail and resumed.finished
             and all(torch.equal(a[k], b[k]) for k in a))
    return {"killed_at_checkpoint": at, "was_killed": was_killed,
            "resumed_from": resumed.first_step, "resumed_steps": len(resumed.losses),
            "resume_bit_exact": exact,
            "max_abs_loss_diff": max((abs(x - y) for x, y in zip(resumed.losses, tail,
                                                                   strict=False)), default=0.0)}


def run(steps: int, resume_steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus, tok = build_corpus(work)
        data = DataConfig(kind="text", path=str(corpus), tokenizer=str(tok))
        ok, failed, diffs, rows = [], [], [], {}
        for family in SPECS:
            try:
                r = roundtrip(family, work, data, steps)
            except Exception as exc:  # a family that breaks is reported, not fatal
                logging.exception("family %s failed", family)
                failed.append(family)
                rows[family] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            rows[family] = r
            diffs += [r["diff_out"], r["diff_in"]]
            (ok if max(r["diff_out"], r["diff_in"]) < TOL else failed).append(family)
        resume = kill_and_resume(work, data, resume_steps)
    return {"families_ok": ok, "families_failed": failed,
            "max_abs_logit_diff": max(diffs, default=None),
            "resume_bit_exact": resume["resume_bit_exact"], "families": rows,
            "resume": resume}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="training steps per family")
    ap.add_argument("--resume-steps", type=int, default=30, help="steps of the killed job")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return
    logging.basicConfig(level=logging.WARNING)
    for name in ("transformers", "huggingface_hub", "safetensors"):
        logging.getLogger(name).setLevel(logging.ERROR)
    out = run(args.steps, args.resume_steps)
    print(f"{'family':<10} {'out |Δlogit|':>13} {'in |Δlogit|':>12} {'loss first→last':>18}")
    for fam, r in out["families"].items():
        if "error" in r:
            print(f"{fam:<10} {r['error']}")
            continue
        print(f"{fam:<10} {r['diff_out']:>13.2e} {r['diff_in']:>12.2e} "
              f"{r['first_loss']:>8.3f}→{r['last_loss']:<8.3f}")
    res = out["resume"]
    print(f"kill/resume (dp=2, text corpus): killed at checkpoint {res['killed_at_checkpoint']}"
          f", resumed {res['resumed_steps']} steps from {res['resumed_from']}, bit-exact "
          f"{res['resume_bit_exact']} (max |Δloss| {res['max_abs_loss_diff']:.1e})")
    print(f"families ok: {', '.join(out['families_ok']) or '-'}; failed: "
          f"{', '.join(out['families_failed']) or '-'}")
    if args.json:
        print(json.dumps({k: out[k] for k in ("families_ok", "families_failed",
                                              "max_abs_logit_diff", "resume_bit_exact")}))


if __name__ == "__main__":
    main()
