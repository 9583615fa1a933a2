"""A tiny PyTorch training script that follows Frenzy's entrypoint protocol.

Submit it with its folder as the job's working directory (see ``job.yaml`` next to it):

    frenzy submit --config examples/byo/job.yaml

What the protocol asks of a script, and where this one does it:

* read the plan from the environment (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``/``PORT``,
  ``FRENZY_TOTAL_STEPS``, ...): ``main``;
* print ``frenzy step=N loss=X`` (rank 0) after each step whose state is saved: Frenzy counts
  a reported step as done and resumable, and shows the loss;
* save to ``FRENZY_CHECKPOINT_DIR`` and, when started again, resume from the latest
  checkpoint there (``FRENZY_RESUME_STEP`` is the last step reported): ``save``/``resume``;
* when ``FRENZY_STOP_FILE`` appears, save and exit 0 (Frenzy resumes it later, possibly on
  other GPUs): the check at the top of the loop;
* write the final weights to ``FRENZY_EXPORT_DIR``: ``export``.

The model learns y = 3x - 1 + noise with a 2-layer MLP; with more than one rank it averages
the gradients over ``torch.distributed`` (gloo), like data parallelism.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def save(ckdir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Write ``step-N.pt`` atomically (a crash mid-write leaves the previous one)."""
    tmp = ckdir / f".step-{step}.pt.tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, ckdir / f"step-{step}.pt")


def resume(ckdir: Path, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Load the latest checkpoint in ``ckdir``; the step to continue from (0: none)."""
    steps = [int(p.stem.split("-")[1]) for p in ckdir.glob("step-*.pt")]
    if not steps:
        return 0
    state = torch.load(ckdir / f"step-{max(steps)}.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


def export(out: Path, model: nn.Module) -> None:
    """The final weights, as safetensors when the package is there (else torch's format)."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    try:
        from safetensors.torch import save_file
    except ImportError:
        torch.save(weights, out / "model.pt")
    else:
        save_file(weights, str(out / "model.safetensors"))


def main() -> int:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    total = int(os.environ.get("FRENZY_TOTAL_STEPS", "100"))
    ckdir = Path(os.environ.get("FRENZY_CHECKPOINT_DIR", "checkpoints"))
    stop_file = Path(os.environ.get("FRENZY_STOP_FILE", "STOP"))
    export_dir = Path(os.environ.get("FRENZY_EXPORT_DIR", ckdir / "export"))
    save_every = int(os.environ.get("SAVE_EVERY", "5"))
    step_sleep = float(os.environ.get("STEP_SLEEP_S", "0"))  # to watch it live
    ckdir.mkdir(parents=True, exist_ok=True)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = resume(ckdir, model, opt)
    gen = torch.Generator().manual_seed(1000 * rank + step)  # the data depends on the step

    def report(loss: float) -> None:
        if rank == 0:
            print(f"frenzy step={step} loss={loss:.6f}", flush=True)

    loss = float("nan")
    while step < total:
        if stop_file.exists():  # asked to stop: save what we have, exit 0
            if rank == 0:
                save(ckdir, step, model, opt)
                report(loss)
            return 0
        x = torch.rand(64, 1, generator=gen) * 2 - 1
        y = 3 * x - 1 + 0.01 * torch.randn(64, 1, generator=gen)
        loss_t = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss_t.backward()
        if world > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        step += 1
        loss = loss_t.item()
        if step % save_every == 0 or step == total:
            if rank == 0:
                save(ckdir, step, model, opt)
            report(loss)  # only saved steps are reported: each is a safe resume point
        if step_sleep:
            time.sleep(step_sleep)
    if rank == 0:
        export(export_dir, model)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
