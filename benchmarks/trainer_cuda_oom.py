"""Out of memory on a real GPU is not a lost job: the built-in trainer's CUDA out-of-memory
error, the re-plan with what the rank held, and the resumed run on the plan it gives.

The CPU tests (tests/orchestrator/test_ray_oom.py) check the loop with the CPU trainer's
emulated cap; this runs the same pieces on CUDA, where the error is the caching allocator's
own. A GPU of ``--cap-gib`` is emulated with ``torch.cuda.set_per_process_memory_fraction``
(the allocator refuses to reserve more; the CUDA context is outside it). The job's plans are
priced for that GPU as if the memory model had under-predicted by ``--under`` (each plan's
tensor terms scaled by ``1 - under``, ``Plan.with_tensors_scaled``: plans the true model would
reject now seem to fit). The best plan runs and must run out of memory; the job is re-planned
from its plans by ``orchestrator.oom.replan_after_oom`` with the rank's figure (what the
Ray backend passes it: the larger of the reserve when the allocator failed and the last
measured tensor peak); the best plan left resumes from the last checkpoint under the same
cap and must finish. On a machine without CUDA it exits with 2.

    PYTHONPATH=. python3 -m benchmarks.trainer_cuda_oom --json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import sys
import tempfile
from typing import Any

import torch

log = logging.getLogger(__name__)

GIB = 1 << 30
MODEL = "gpt2-medium"
SEQ, BATCH, STEPS = 1024, 16, 4


def gpu_bytes(cap: int) -> int:
    """The emulated GPU's memory: ``cap`` bytes of allocator room and the H200's CUDA
    context outside it."""
    from predictor.gpus import get_gpu

    return cap + get_gpu("H200").cuda_context_bytes


def _plans(cap: int, under: float) -> tuple[Any, ...]:
    """The job's single-GPU plans on an H200 of ``cap`` bytes of allocator room (plus the
    context outside it), as the under-predicting model prices them: the planner's plans for
    GPUs of 1 / (1 - under), 1 and (1 - under) times that size (a ladder of micro-batches and
    recomputation modes), their tensors scaled by (1 - under), those that then seem to fit,
    fastest first."""
    from orchestrator.oom import scale_plans
    from predictor.gpus import get_gpu
    from predictor.planner import plan_job
    from predictor.spec import ModelSpec, TrainingSpec

    h200 = get_gpu("H200")
    model, train = ModelSpec.from_name(MODEL), TrainingSpec(global_batch=BATCH, seq_len=SEQ)
    limit = gpu_bytes(cap)
    found: dict[str, Any] = {}
    for size in (limit / (1.0 - under), limit, limit * (1.0 - under)):
        gpu = dataclasses.replace(h200, memory_bytes=int(size))
        for p in plan_job(model, train, [gpu], max_gpus=1, keep_all=True).plans:
            found.setdefault(p.label(), p)
    scaled = scale_plans(tuple(found.values()), 1.0 - under,
                         f"emulated under-prediction by {under:.0%}")
    return tuple(sorted((p for p in scaled if p.required_bytes <= limit),
                        key=lambda p: (p.step_time_s, p.label())))


def _config(plan: Any, tmp: str) -> Any:
    from orchestrator.trainer.loop import RunConfig
    from predictor.spec import ModelSpec

    par = plan.parallel
    return RunConfig(job_id="cuda-oom", model=ModelSpec.from_name(MODEL), global_batch=BATCH,
                     seq_len=SEQ, total_steps=STEPS, micro_batch=par.micro_batch,
                     recompute=par.recompute, precision=plan.precision,
                     checkpoint_dir=tmp, checkpoint_every=1)


def _run(plan: Any, tmp: str) -> dict[str, Any]:
    """Train ``plan`` from the newest checkpoint; its per-step peaks, or the out-of-memory
    error's figures."""
    from orchestrator.trainer import loop
    from orchestrator.trainer.memory import RankOutOfMemory

    dev = torch.device("cuda", 0)
    steps: list[dict[str, int]] = []
    gc.collect()  # the failed run's tensors, held by its traceback until now

    def on_step(status: dict[str, Any]) -> None:
        torch.cuda.synchronize(dev)
        steps.append({"step": int(status.get("steps_done", 0)),
                      "alloc": torch.cuda.max_memory_allocated(dev),
                      "reserved": torch.cuda.max_memory_reserved(dev)})
        torch.cuda.reset_peak_memory_stats(dev)

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    out: dict[str, Any] = {"plan": plan.label(), "predicted_tensors": plan.memory.tensors,
                           "required_bytes": plan.required_bytes}
    try:
        result = loop.train(_config(plan, tmp), 0, loop.Control(on_step=on_step))
    except RankOutOfMemory as e:
        out.update(oom=True, held_bytes=e.held_bytes, cap_bytes=e.cap_bytes, cuda=e.cuda,
                   steps=steps, error=str(e)[:300])
        return out
    out.update(oom=False, steps=steps, first_step=result.first_step,
               steps_done=result.steps_done, finished=result.finished,
               alloc=max(s["alloc"] for s in steps), reserved=max(s["reserved"] for s in steps))
    return out


def run(cap_gib: float, under: float) -> dict[str, Any]:
    """The whole check; raises ``AssertionError`` naming what did not hold."""
    from orchestrator.backend import OutOfMemory
    from orchestrator.oom import replan_after_oom
    from scheduler.cluster import ClusterState, Node
    from scheduler.job import JobView

    dev = torch.device("cuda", 0)
    total = torch.cuda.get_device_properties(dev).total_memory
    cap = int(cap_gib * GIB)
    torch.cuda.set_per_process_memory_fraction(cap / total, dev)
    plans = _plans(cap, under)
    assert plans, "no plan seems to fit: raise --cap-gib"
    job = JobView(id="cuda-oom", submit_time=0.0, plans=plans, total_steps=STEPS)
    state = ClusterState((Node("gpu0", "H200", gpu_bytes(cap), 1, 1, "nvlink"),))
    with tempfile.TemporaryDirectory(prefix="frz-cuda-oom-") as tmp:
        first = _run(plans[0], tmp)
        assert first["oom"], f"{first['plan']} did not run out of memory under {cap_gib} GiB"
        peak = max((s["alloc"] for s in first["steps"]), default=0)
        held = max(first["held_bytes"], peak)  # as the Ray backend reports it
        done = first["steps"][-1]["step"] if first["steps"] else 0
        event = OutOfMemory(job.id, 0.0, done, held, first["cap_bytes"], "cuda oom",
                            first["cuda"])
        replanned = replan_after_oom(job, plans[0], event, state)
        assert replanned.view is not None, replanned.reason
        second = _run(replanned.view.plans[0], tmp)
    assert not second["oom"], f"the re-planned {second['plan']} ran out of memory too"
    assert second["finished"] and second["steps_done"] == STEPS
    return {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "cap_bytes": cap, "under_predicted_by": under, "plans": len(plans),
            "ran_out": first, "replan": {"factor": replanned.factor,
                                         "plans_left": len(replanned.view.plans),
                                         "reason": replanned.reason},
            "resumed": second,
            "resumed_fits": second["reserved"] <= cap}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap-gib", type=float, default=10.0,
                    help="the emulated GPU's allocator room, GiB")
    ap.add_argument("--under", type=float, default=0.4,
                    help="the emulated memory model's under-prediction (fraction)")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not torch.cuda.is_available():
        log.error("no CUDA device: this check runs the trainer on a GPU")
        return 2
    if not 0.0 <= args.under < 1.0:
        ap.error(f"--under must be in [0, 1), got {args.under}")
    out = run(args.cap_gib, args.under)
    first, second = out["ran_out"], out["resumed"]
    print(f"{out['device']}, allocator room {args.cap_gib:g} GiB, plans under-predicted by "
          f"{args.under:.0%} ({out['plans']} seem to fit)")
    print(f"  ran out:  {first['plan']}: held {first['held_bytes'] / GIB:.2f} GiB "
          f"(CUDA: {first['cuda']}) after {len(first['steps'])} step(s)")
    print(f"  re-plan:  x{out['replan']['factor']:.2f}, {out['replan']['plans_left']} plans "
          f"left; {out['replan']['reason']}")
    print(f"  resumed:  {second['plan']} from step {second['first_step']}: "
          f"{second['steps_done']} steps, peak {second['alloc'] / GIB:.2f} GiB allocated, "
          f"{second['reserved'] / GIB:.2f} GiB reserved (predicted "
          f"{second['predicted_tensors'] / GIB:.2f} GiB of tensors)")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
