"""Entrypoint mode: run the user's own training command on every worker.

The plan is exported as environment variables, the names torchrun and Megatron scripts
read: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TP_SIZE``, ``PP_SIZE``, ``DP_SIZE``, ``MICRO_BATCH_SIZE``, ``GLOBAL_BATCH_SIZE``,
``CUDA_VISIBLE_DEVICES`` (the GPU Ray gave this worker), plus ``FRENZY_JOB_ID``,
``FRENZY_CHECKPOINT_DIR`` (``<checkpoint_dir>/<job_id>``: save and resume there),
``FRENZY_TOTAL_STEPS``, ``FRENZY_RESUME_STEP``, ``FRENZY_STOP_FILE`` and
``FRENZY_EXPORT_DIR`` (``<checkpoint_dir>/<job_id>/export``: final weights go there, listed
by ``GET /v1/jobs/{id}/artifacts``). With a working directory (``RunConfig.working_dir``;
under Ray the job's folder shipped as ``runtime_env`` ``working_dir``) the command starts in
the rank's own copy of it, so ``python train.py`` finds ``train.py``.

Progress: a line ``frenzy step=<n> [loss=<x>] [samples_per_s=<y>]`` printed by rank 0 is
reported to the controller; other output goes to the worker's log. Stop: Frenzy creates
``FRENZY_STOP_FILE``; a script that checkpoints and exits 0 when it appears is stopped and
resumed cleanly, otherwise its process group gets SIGTERM after a grace period. Exit code 0
means finished (or stopped on request); anything else fails the job with a reason naming the
exit code and the rank's log, never the output itself.

The command runs contained (``orchestrator.sandbox``): its own uid and gid, only the variables
above plus a minimal ``PATH``/``HOME``, a checkpoint folder only the job's ranks can enter,
and all its processes end with it. Its output goes to the service-owned log
``<checkpoint_dir>/.logs/<job_id>/rank-<n>.log`` (and the worker's log).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
from pathlib import Path

from orchestrator import sandbox
from orchestrator.trainer.checkpoint import job_dir
from orchestrator.trainer.loop import Control, RunConfig, RunResult

log = logging.getLogger(__name__)

_PROGRESS = re.compile(r"^frenzy\s+step=(\d+)(?:\s+loss=([-+\w.]+))?(?:\s+samples_per_s=([\w.]+))?")
STOP_GRACE_S = 30.0
EXPORT_DIR = "export"
"""Sub-folder of the job's checkpoint folder where an entrypoint writes its final weights."""


def plan_env(cfg: RunConfig, rank: int, gpu_ids: list[str] | None = None,
             stop_file: Path | None = None) -> dict[str, str]:
    """The environment variables that describe rank ``rank``'s part of the plan."""
    ckdir = job_dir(cfg.checkpoint_dir, cfg.job_id)
    env = {
        "WORLD_SIZE": str(cfg.world_size), "RANK": str(rank), "LOCAL_RANK": "0",
        "MASTER_ADDR": cfg.master_addr, "MASTER_PORT": str(cfg.master_port),
        "TP_SIZE": str(cfg.tp), "PP_SIZE": str(cfg.pp), "DP_SIZE": str(cfg.dp),
        "MICRO_BATCH_SIZE": str(cfg.micro_batch), "GLOBAL_BATCH_SIZE": str(cfg.global_batch),
        "FRENZY_JOB_ID": cfg.job_id, "FRENZY_CHECKPOINT_DIR": str(ckdir),
        "FRENZY_TOTAL_STEPS": str(cfg.total_steps),
        "FRENZY_STOP_FILE": str(stop_file or ckdir / f".stop-{rank}"),
        "FRENZY_EXPORT_DIR": str(ckdir / EXPORT_DIR),
    }
    if gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    elif "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return {**env, **cfg.env}


def run_entrypoint(cfg: RunConfig, rank: int, control: Control) -> RunResult:
    """Run ``cfg.entrypoint`` as rank ``rank``, contained, and follow its progress lines."""
    assert cfg.entrypoint
    box = sandbox.prepare(cfg.checkpoint_dir, cfg.job_id, rank)
    env = plan_env(cfg, rank, stop_file=box.stop_file)
    if cfg.working_dir:
        try:
            box.install_workdir(cfg.working_dir)
        except (OSError, sandbox.SandboxError) as e:
            box.close(None)
            raise RuntimeError(f"cannot set up the working directory on rank {rank}: "
                               f"{e}") from None
    resume = int(cfg.env.get("FRENZY_RESUME_STEP", "0"))
    env["FRENZY_RESUME_STEP"] = str(resume)
    control.report(steps_done=resume, checkpoint_step=resume, first_step=resume, loss=None,
                   samples_per_s=None, rank=rank)
    try:
        proc = box.popen(cfg.entrypoint, box.env(env))
    except OSError as e:
        box.close(None)
        raise RuntimeError(f"cannot start the entrypoint {cfg.entrypoint[0]!r} on rank {rank}: "
                           f"{e.strerror} (it runs as an unprivileged user: the program and "
                           "its folders must be readable and executable by others)") from None
    exited = threading.Event()

    def watch_stop() -> None:
        while not control.stop.wait(0.5):
            if exited.is_set():
                return
        if proc.poll() is None:
            box.request_stop()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                box.terminate(proc)

    def reap() -> None:  # the job ends with its main process: nothing of it outlives that
        proc.wait()
        exited.set()
        box.kill_all(proc)

    threading.Thread(target=watch_stop, daemon=True).start()
    reaper = threading.Thread(target=reap, daemon=True)
    reaper.start()
    assert proc.stdout is not None
    steps = resume
    try:
        with box.open_log() as out:
            for line in proc.stdout:
                out.write(line)  # stops at sandbox.LOG_LIMIT_BYTES
                line = line.rstrip("\n")
                m = _PROGRESS.match(line)
                if m:
                    steps = int(m.group(1))
                    control.report(steps_done=steps, checkpoint_step=steps,
                                   loss=float(m.group(2)) if m.group(2) else None,
                                   samples_per_s=float(m.group(3)) if m.group(3) else None)
                else:
                    log.info("[%s rank %d] %s", cfg.job_id, rank, line)
        code = proc.wait()
        reaper.join()
    finally:
        box.close(proc)
    stopped = control.stop.is_set()
    if code != 0 and not stopped:
        raise RuntimeError(f"entrypoint exited with code {code} on rank {rank}; its output is "
                           f"in the job's log (.logs/{cfg.job_id}/{box.log_path.name} under the "
                           "checkpoint folder)")
    return RunResult(steps_done=steps, checkpoint_step=steps,
                     finished=not stopped, stopped=stopped, first_step=resume)
