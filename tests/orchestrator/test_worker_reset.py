"""A training worker reused across jobs (the warm pool) starts each job clean: no process
group, environment variables or working directory left by the previous job; its GPU slot
maps to the device Ray would name. No Ray needed: the worker class is plain Python."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from orchestrator.trainer.local import free_port
from orchestrator.trainer.worker import TrainingWorker, slot_device


def test_slot_device_follows_the_nodes_own_device_list() -> None:
    assert slot_device(0, None) == "0"
    assert slot_device(3, "") == "3"
    assert slot_device(1, "4,6") == "6"  # a raylet started with CUDA_VISIBLE_DEVICES=4,6
    assert slot_device(0, " 2 , 7") == "2"
    with pytest.raises(ValueError, match="slot 2"):
        slot_device(2, "4,6")


def test_a_slot_worker_selects_its_gpu_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    w = TrainingWorker(-1, torch.get_num_threads(), slot=1)
    assert w.device == "5" and os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_reset_clears_what_the_previous_job_left(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    monkeypatch.setenv("FRENZY_TEST_BASE", "1")
    monkeypatch.delenv("JOB_A_SECRET", raising=False)
    cwd = os.getcwd()
    w = TrainingWorker(-1, threads)
    try:
        # job A: its own variables, folder, thread count, process group and progress
        os.environ["JOB_A_SECRET"] = "a"
        del os.environ["FRENZY_TEST_BASE"]
        os.chdir(tmp_path)
        torch.set_num_threads(threads + 1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
        w.control.report(steps_done=7, loss=1.0)
        old_control = w.control
        w.reset()
        assert "JOB_A_SECRET" not in os.environ
        assert os.environ["FRENZY_TEST_BASE"] == "1"
        assert os.getcwd() == cwd
        assert torch.get_num_threads() == threads
        assert not dist.is_initialized()
        assert w.control is not old_control and w.control.status == {}
        assert not w.control.stop.is_set()
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
        if dist.is_initialized():
            dist.destroy_process_group()


def test_warm_up_trains_a_step_and_leaves_the_worker_clean(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    before = dict(os.environ)
    w = TrainingWorker(-1, threads)
    assert w.warm_up() == os.getpid()
    assert dict(os.environ) == before
    assert not dist.is_initialized()
    assert w.control.status == {} and w.jobs_run == 0
