"""A ranked, placeable training plan: GPU type and count, parallel layout, memory, time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from predictor.memory import MemoryBreakdown
from predictor.runtimes import DEFAULT_RUNTIME
from predictor.spec import ParallelConfig, Precision
from predictor.step_time import StepTime

_COUNTED_TERMS = ("parameters", "gradients", "optimizer_states", "activations", "logits",
                  "transient")
"""``MemoryBreakdown`` terms a measured tensor peak scales: the model's tensors (not the fixed
cuBLAS workspaces, nor what lives outside the allocator)."""


def scale_counted(mem: MemoryBreakdown, factor: float, *, slack: bool = False
                  ) -> MemoryBreakdown:
    """``mem``'s counted model tensors multiplied by ``factor`` (``slack``: the allocator's
    slack over them too); workspace and the memory outside the allocator as they are."""
    names = (*_COUNTED_TERMS, "slack") if slack else _COUNTED_TERMS
    return replace(mem, **{name: round(getattr(mem, name) * factor) for name in names})


@dataclass(frozen=True, slots=True)
class Plan:
    """One way to run a job: ``parallel.num_gpus`` GPUs of ``gpu_type``.

    ``required_bytes`` is what a GPU must offer for the plan (the device figure plus the
    planner's safety margin); schedulers compare it with a node's GPU memory (Frenzy's
    ``reqSz``). ``runtime`` names the ``predictor.runtimes`` profile the memory was priced
    for.
    """

    gpu_type: str
    parallel: ParallelConfig
    precision: Precision
    memory: MemoryBreakdown
    step: StepTime
    num_steps: int
    required_bytes: int
    rank: int = 0
    reason: str = ""
    notes: tuple[str, ...] = field(default=())
    runtime: str = DEFAULT_RUNTIME
    memory_factor: float = 1.0
    """The measured correction already in ``memory``'s tensor terms (an online residual, an
    out-of-memory run): the model's own prediction is the tensors divided by it."""
    step_factor: float = 1.0
    """The observed / predicted correction already in ``step`` (a scheduler's online
    estimate, ``scheduler.corrected``): the model's own step time is ``step`` divided by it."""

    @property
    def num_gpus(self) -> int:
        return self.parallel.num_gpus

    @property
    def peak_memory_bytes(self) -> int:
        return self.memory.total

    @property
    def step_time_s(self) -> float:
        return self.step.total_s

    @property
    def job_time_s(self) -> float:
        return self.step.total_s * self.num_steps

    @property
    def gpu_seconds(self) -> float:
        return self.job_time_s * self.num_gpus

    def with_step(self, step: StepTime) -> Plan:
        """The same plan with a step time re-estimated for a concrete placement (the
        model's own: no correction in it)."""
        return replace(self, step=step, step_factor=1.0)

    def with_step_factor(self, factor: float) -> Plan:
        """The plan timed at ``factor`` × the model's own step time, whatever correction
        it carried (``with_step_factor(1.0)`` is the model's own)."""
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        if factor == self.step_factor:
            return self
        k = factor / self.step_factor
        return replace(self, step=StepTime(**{name: v * k for name, v
                                              in self.step.as_dict().items()}),
                       step_factor=factor)

    def with_tensors_scaled(self, factor: float, note: str) -> Plan:
        """The plan with the model's tensor terms and the allocator's slack over them
        multiplied by ``factor`` (``scale_counted``) and ``required_bytes`` grown in
        proportion to the device figure, so the planner's margin is kept; ``note`` says why
        (a measured correction)."""
        if factor <= 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        m = self.memory
        scaled = scale_counted(m, factor, slack=True)
        required = -(-self.required_bytes * scaled.device // max(m.device, 1))
        return replace(self, memory=scaled, required_bytes=required,
                       notes=(*self.notes, note), memory_factor=self.memory_factor * factor)

    @property
    def model_tensors_bytes(self) -> int:
        """The predicted tensors without the cuBLAS workspaces: what a CPU rank holds."""
        return self.memory.tensors - self.memory.workspace

    def tensor_room(self, capacity: int) -> int:
        """The model-tensor bytes a GPU of ``capacity`` bytes leaves this plan after what it
        predicts beside them (allocator slack, cuBLAS workspaces, memory outside the
        allocator): the cap an emulated GPU's CPU rank enforces."""
        return capacity - (self.memory.device - self.model_tensors_bytes)

    def label(self) -> str:
        p = self.parallel
        return (
            f"{p.num_gpus}x{self.gpu_type} tp{p.tp} pp{p.pp} dp{p.dp} mb{p.micro_batch} "
            f"rc={p.recompute.value} zero{p.zero_stage}"
        )

    def to_dict(self) -> dict[str, Any]:
        p = self.parallel
        return {
            "rank": self.rank,
            "gpu_type": self.gpu_type,
            "num_gpus": p.num_gpus,
            "tp": p.tp,
            "pp": p.pp,
            "dp": p.dp,
            "micro_batch": p.micro_batch,
            "recompute": p.recompute.value,
            "zero_stage": p.zero_stage,
            "sequence_parallel": p.sequence_parallel,
            "flash_attention": p.flash_attention,
            "precision": self.precision.value,
            "peak_memory_bytes": self.peak_memory_bytes,
            "tensors_bytes": self.memory.tensors,
            "reserved_bytes": self.memory.reserved,
            "device_bytes": self.memory.device,
            "runtime": self.runtime,
            "required_bytes": self.required_bytes,
            "memory": self.memory.as_dict(),
            "step_time_s": self.step_time_s,
            "step": self.step.as_dict(),
            "num_steps": self.num_steps,
            "job_time_s": self.job_time_s,
            "gpu_seconds": self.gpu_seconds,
            "reason": self.reason,
            "notes": list(self.notes),
            **({"memory_factor": self.memory_factor} if self.memory_factor != 1.0 else {}),
            **({"step_factor": self.step_factor} if self.step_factor != 1.0 else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """The plan ``to_dict`` wrote (what the service stores at submission): derived
        figures (totals, job time, GPU-seconds) are recomputed, not read."""
        mem_fields, step_fields = _MEMORY_FIELDS, _STEP_FIELDS
        parallel = ParallelConfig(
            tp=int(d["tp"]), pp=int(d["pp"]), dp=int(d["dp"]),
            micro_batch=int(d["micro_batch"]), recompute=d["recompute"],
            zero_stage=int(d["zero_stage"]),
            sequence_parallel=bool(d.get("sequence_parallel", False)),
            flash_attention=bool(d.get("flash_attention", True)),
        )
        return cls(
            gpu_type=str(d["gpu_type"]), parallel=parallel,
            precision=Precision(d["precision"]),
            memory=MemoryBreakdown(**{k: int(v) for k, v in d["memory"].items()
                                      if k in mem_fields}),
            step=StepTime(**{k: float(v) for k, v in d["step"].items() if k in step_fields}),
            num_steps=int(d["num_steps"]), required_bytes=int(d["required_bytes"]),
            rank=int(d.get("rank", 0)), reason=str(d.get("reason", "")),
            notes=tuple(d.get("notes", ())),
            runtime=str(d.get("runtime", DEFAULT_RUNTIME)),
            memory_factor=float(d.get("memory_factor", 1.0)),
            step_factor=float(d.get("step_factor", 1.0)),
        )


_MEMORY_FIELDS = frozenset(f.name for f in fields(MemoryBreakdown))
_STEP_FIELDS = frozenset(f.name for f in fields(StepTime))
"""What ``Plan.from_dict`` reads of a stored breakdown (the stored dicts carry derived
totals too); worked out once, not per stored plan."""
