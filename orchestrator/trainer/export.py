"""A job's checkpoints as artifacts, and export to a Hugging Face model folder.

Checkpoints of the built-in trainer record the model spec, its ``Numerics`` and the job's
tokenizer beside the tensors (``loop.checkpoint_extra``), so a checkpoint alone is enough to
write ``config.json`` + ``model.safetensors`` (+ the tokenizer files) that
``transformers.AutoModelForCausalLM.from_pretrained`` loads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer.model import Numerics
from predictor.spec import ModelSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Artifact:
    """One checkpoint file of a job."""

    step: int
    path: Path
    size_bytes: int
    modified_at: float  # seconds since the epoch

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "path": str(self.path), "size_bytes": self.size_bytes,
                "modified_at": self.modified_at}


def artifacts(root: str | Path, job_id: str) -> list[Artifact]:
    """The job's checkpoints, oldest first (empty when it has none)."""
    out = []
    for step in ckpt.list_steps(root, job_id):
        path = ckpt.step_path(root, job_id, step)
        try:
            st = path.stat()
        except FileNotFoundError:  # pruned meanwhile
            continue
        out.append(Artifact(step, path.resolve(), st.st_size, st.st_mtime))
    return out


def export_hf(root: str | Path, job_id: str, out: str | Path,
              step: int | None = None) -> list[Path]:
    """Write the job's checkpoint at ``step`` (default: the newest) as a Hugging Face model
    folder ``out``; returns the files written. ``ValueError`` says what is missing."""
    from orchestrator.trainer.hf import save_folder

    steps = ckpt.list_steps(root, job_id)
    if not steps:
        raise ValueError(f"job {job_id} has no checkpoint under {Path(root).resolve()}")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ValueError(f"job {job_id} has no checkpoint at step {step}; kept: "
                         f"{', '.join(map(str, steps))}")
    data = ckpt.read(ckpt.step_path(root, job_id, step))
    if "model_spec" not in data:
        raise ValueError(f"checkpoint step {step} of job {job_id} predates export support "
                         "(no model spec recorded); train one more checkpoint to export")
    spec = ModelSpec(**data["model_spec"])
    numerics = Numerics(**data.get("numerics") or {})
    tokenizer = data.get("tokenizer")
    if tokenizer and not Path(tokenizer).exists():
        log.warning("job %s: tokenizer %s is gone; exporting the weights without it", job_id,
                    tokenizer)
        tokenizer = None
    files = save_folder(out, data["model"], spec, numerics, tokenizer)
    log.info("job %s step %d exported to %s", job_id, step, out)
    return files
