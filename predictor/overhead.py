"""Memory outside the counted tensors: the caching allocator's slack and the device overhead.

Three figures per plan (``MemoryBreakdown``):

* tensors  — what ``torch.cuda.max_memory_allocated`` sees: the counted tensors
  (``predictor.memory``) plus, on a GPU, the cuBLAS / cuBLASLt workspaces that PyTorch
  and Transformer Engine take from the caching allocator (``workspace_bytes``: 32 MiB per
  handle on Hopper, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, and as much again for the
  cuBLASLt / TE GEMM workspace — an a-priori figure, not fitted);
* reserved — tensors plus the caching allocator's slack (``max_memory_reserved``):
  ``slack = slack_fraction · tensors + slack_bytes``; the allocator rounds blocks up
  (512 B / 2 MiB segments) and keeps freed blocks cached, so the slack grows with the
  tensors it serves;
* device   — reserved plus what lives outside the allocator (nvidia-smi): the CUDA context
  with its kernel images and the cuBLAS workspace (``GpuType.cuda_context_bytes``, per GPU
  type), and NCCL's communicator buffers in a job of more than one GPU (``nccl_bytes``).

The constants are calibrated on the public real-GPU measurements
(``benchmarks.memory_accuracy``, leave-one-source-out; docs/memory_accuracy.md gives the
fit and its held-out errors). ``FIT_MARGIN`` is the fraction of a GPU the planner keeps
free on top of the device figure: the largest held-out under-prediction seen there,
rounded up.
"""

from __future__ import annotations

from dataclasses import dataclass

from predictor.gpus import GpuType
from predictor.memory import MemoryBreakdown

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class NonTensorModel:
    """The few free constants of the non-tensor terms (see the module docstring)."""

    slack_fraction: float = 0.0
    slack_bytes: int = 0
    nccl_bytes: int = 0
    workspace_bytes: int = 0

    def workspace(self, gpu: GpuType | None) -> int:
        """Allocator-held GEMM workspaces (only on a GPU)."""
        return self.workspace_bytes if gpu is not None else 0

    def slack(self, tensors: int) -> int:
        """Caching-allocator bytes reserved beyond ``tensors`` at the peak."""
        return int(self.slack_fraction * tensors) + self.slack_bytes

    def outside(self, gpu: GpuType | None, num_gpus: int) -> int:
        """Bytes outside the allocator: CUDA context (+ cuBLAS) and NCCL buffers."""
        if gpu is None:
            return 0
        return gpu.cuda_context_bytes + (self.nccl_bytes if num_gpus > 1 else 0)

    def budget(self, capacity: int, gpu: GpuType | None, num_gpus: int, margin: float
               ) -> float:
        """The largest tensor peak whose device figure fits ``capacity`` with ``margin``
        kept free (the inverse of ``tensors -> tensors + slack + outside``)."""
        free = capacity * (1.0 - margin) - self.outside(gpu, num_gpus) - self.slack_bytes
        return free / (1.0 + self.slack_fraction) - self.workspace(gpu)

    def fill(self, mem: MemoryBreakdown, gpu: GpuType | None, num_gpus: int
             ) -> MemoryBreakdown:
        """``mem`` (counted tensors only) with the workspace, slack and outside terms."""
        ws = self.workspace(gpu)
        tensors = mem.tensors - mem.workspace + ws
        return MemoryBreakdown(mem.parameters, mem.gradients, mem.optimizer_states,
                               mem.activations, mem.logits, self.outside(gpu, num_gpus),
                               mem.transient, mem.stage, self.slack(tensors), ws, mem.paged)


NON_TENSOR = NonTensorModel(slack_fraction=0.09, slack_bytes=0, nccl_bytes=512 * MIB,
                            workspace_bytes=64 * MIB)
"""Calibrated constants (docs/memory_accuracy.md): ``slack_fraction`` is the median excess
of the 16 reserved / nvidia-smi rows (ms-swift, Hugging Face docs, torchtitan) over their
predicted tensors and outside terms (0.0894; leave-one-source-out 0.135 without ms-swift's
rows, 0.094 without the Hugging Face docs' rows, 0.071 without torchtitan's). ``nccl_bytes``
is not in the public data (no multi-GPU row reads nvidia-smi): NCCL's default 4 MiB buffer
(``NCCL_BUFFSIZE``) per channel and peer over the 16-32 channels of an NVLink node gives
256-512 MiB; the upper end is taken."""

FIT_MARGIN = 0.13
"""Fraction of the GPU kept free beyond the device figure: the 95th percentile of
1 − predicted/measured over the 79 held-out real-GPU rows (``benchmarks.real_memory.
margin_from``); 9 % would cover 90 % of them, 46 % all (the worst is a fragmented reserved
figure, docs/memory_accuracy.md)."""
