"""Checkpoint resumes of the built-in trainer on a real GPU, across plan changes.

A job the control loop re-plans (out of memory, a lost node, growth or shrinking) resumes
from its newest checkpoint on another plan: the checkpoint is resharded to the new layout.
The CPU tests check that the weights come back exactly (tests/orchestrator/test_trainer*.py);
this runs the same resumes with the ranks' tensors on CUDA, where device placement can go
wrong where the CPU cannot show it (an optimizer state left on the CPU). Each case trains
``--steps`` steps on one plan (a checkpoint every step), then resumes on another plan for as
many more, all ranks of a plan sharing the one GPU over gloo; a case holds when the resumed
run starts at the saved step, finishes, and its losses are finite and continue the first
run's (the first resumed loss within ``LOSS_JUMP`` of the last saved one). On a machine
without CUDA it exits with 2.

    PYTHONPATH=. python3 -m benchmarks.trainer_cuda_resume --json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

LOSS_JUMP = 0.5
"""Largest change of the loss across a resume (nats): a lost or misplaced state shows as a
jump back towards the untrained loss (ln 8192 = 9.0 here)."""


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    dp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 2
    recompute: str = "none"
    precision: str = "bf16"

    def label(self) -> str:
        return (f"tp{self.tp}dp{self.dp}pp{self.pp} z{self.zero} mb{self.micro_batch} "
                f"{self.recompute} {self.precision}")


CASES: list[tuple[Layout, Layout]] = [
    (Layout(), Layout(micro_batch=4, recompute="full")),  # one rank: the plan change of a re-plan
    (Layout(tp=2), Layout(dp=2, zero=2)),
    (Layout(dp=2, zero=3), Layout(pp=2)),
    (Layout(pp=2, dp=2, zero=1), Layout(tp=2, dp=2, zero=3)),
    (Layout(dp=2, zero=2, precision="fp16"), Layout(dp=2, precision="fp16")),
    (Layout(dp=2, precision="fp32"), Layout(tp=2, pp=2, precision="fp32")),
]


def _config(layout: Layout, tmp: str, steps: int) -> Any:
    from orchestrator.trainer.loop import RunConfig
    from predictor.spec import ModelSpec, Recompute

    model = ModelSpec("resume-llama", "llama", num_layers=4, hidden_size=256, num_heads=8,
                      num_kv_heads=4, ffn_hidden_size=704, vocab_size=8192, max_seq_len=256,
                      tie_embeddings=False)
    return RunConfig(job_id="cuda-resume", model=model, global_batch=16, seq_len=256,
                     total_steps=steps, tp=layout.tp, dp=layout.dp, pp=layout.pp,
                     micro_batch=layout.micro_batch, recompute=Recompute(layout.recompute),
                     zero_stage=layout.zero, precision=layout.precision,
                     checkpoint_dir=tmp, checkpoint_every=1)


def _train(cfg: Any) -> list[Any]:
    from orchestrator.trainer.local import run_local

    return run_local(cfg, timeout_s=300.0)


def run_case(first: Layout, then: Layout, steps: int) -> dict[str, Any]:
    """``first`` for ``steps`` steps, then ``then`` to twice as many; what each reported."""
    out: dict[str, Any] = {"first": first.label(), "then": then.label()}
    with tempfile.TemporaryDirectory(prefix="frz-cuda-resume-") as tmp:
        try:
            a = _train(_config(first, tmp, steps))[0]
            b = _train(_config(then, tmp, 2 * steps))[0]
        except Exception as e:  # a failed case is this check's finding
            out.update(ok=False, error=f"{type(e).__name__}: {str(e)[-400:]}")
            return out
    losses_a, losses_b = list(a.losses), list(b.losses)
    jump = abs(losses_b[0] - losses_a[-1]) if losses_a and losses_b else math.inf
    finite = all(math.isfinite(x) for x in losses_a + losses_b)
    ok = (b.first_step == steps and b.finished and b.steps_done == 2 * steps and finite
          and jump <= LOSS_JUMP)
    out.update(ok=ok, resumed_at=b.first_step, steps_done=b.steps_done, losses_first=losses_a,
               losses_then=losses_b, loss_jump=jump)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="steps before and after the resume")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if not torch.cuda.is_available():
        log.error("no CUDA device: this check runs the trainer on a GPU")
        return 2
    os.environ["FRENZY_DIST_BACKEND"] = "gloo"  # several ranks on the one GPU
    rows = [run_case(a, b, args.steps) for a, b in CASES]
    for r in rows:
        tail = (f"resumed at {r['resumed_at']}, loss {r['losses_first'][-1]:.3f} -> "
                f"{r['losses_then'][0]:.3f}" if "resumed_at" in r else r["error"])
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['first']:>28} -> {r['then']:<28} {tail}")
    summary = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cases": len(rows), "ok": sum(r["ok"] for r in rows), "rows": rows}
    if args.json:
        print(json.dumps(summary))
    return 0 if summary["ok"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
