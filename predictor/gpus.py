"""The GPU catalog: memory, dense tensor throughput and links per GPU type.

The data lives in ``predictor/data/gpus.yaml`` (package data, read with ``importlib.resources``
so an installed wheel has it) with a source for every figure; this module only reads it (once,
cached) into frozen ``GpuType`` values.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from predictor.errors import SpecError
from predictor.spec import Precision

CATALOG_PATH: Traversable = resources.files("predictor") / "data" / "gpus.yaml"
GIB = 1 << 30

_REQUIRED = ("memory_bytes", "fp16_tflops", "fp32_tflops", "mem_bw_gbs", "link", "link_bw_gbs",
             "pcie_bw_gbs", "source")


@dataclass(frozen=True, slots=True)
class GpuType:
    """One GPU model's figures (see predictor/data/gpus.yaml for units, sources)."""

    name: str
    memory_bytes: int
    bf16_tflops: float | None
    fp16_tflops: float
    fp32_tflops: float
    mem_bw_gbs: float
    link: str
    link_bw_gbs: float
    pcie_bw_gbs: float
    source: str
    # Calibration constants (each with its own source/derivation in the YAML comments):
    runtime_overhead_bytes: int = 0  # legacy single figure; see cuda_context_bytes
    cuda_context_bytes: int = 0  # CUDA context + cuBLAS workspace of one process (nvidia-smi)
    matmul_efficiency: float = 0.5  # achievable fraction of the dense peak in training GEMMs
    nccl_efficiency: float = 0.7  # NCCL bus bandwidth / link bandwidth for large messages
    nccl_latency_us: float = 30.0  # fixed cost of one collective / p2p (launch + sync)
    inter_node_bw_gbs: float = 12.5  # default per-node network bandwidth, GB/s (100 Gb/s)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def peak_tflops(self, precision: Precision) -> float:
        """Dense peak for the precision's matmuls; bf16 on a GPU without it runs as fp32."""
        if precision is Precision.FP16:
            return self.fp16_tflops
        if precision is Precision.BF16:
            return self.bf16_tflops if self.bf16_tflops else self.fp32_tflops
        return self.fp32_tflops

    def supports(self, precision: Precision) -> bool:
        return precision is not Precision.BF16 or bool(self.bf16_tflops)


def _parse(name: str, raw: Any) -> GpuType:
    if not isinstance(raw, dict):
        raise SpecError(f"gpus.{name}", "must be a mapping of figures")
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise SpecError(f"gpus.{name}", f"missing {', '.join(missing)}")
    if raw["link"] not in ("nvlink", "pcie"):
        raise SpecError(f"gpus.{name}.link", f"must be nvlink or pcie, got {raw['link']!r}")
    return GpuType(
        name=name,
        memory_bytes=int(raw["memory_bytes"]),
        bf16_tflops=float(raw["bf16_tflops"]) if raw.get("bf16_tflops") else None,
        fp16_tflops=float(raw["fp16_tflops"]),
        fp32_tflops=float(raw["fp32_tflops"]),
        mem_bw_gbs=float(raw["mem_bw_gbs"]),
        link=str(raw["link"]),
        link_bw_gbs=float(raw["link_bw_gbs"]),
        pcie_bw_gbs=float(raw["pcie_bw_gbs"]),
        source=str(raw["source"]),
        runtime_overhead_bytes=int(raw.get("runtime_overhead_bytes", 0)),
        cuda_context_bytes=int(raw.get("cuda_context_bytes",
                                       raw.get("runtime_overhead_bytes", 0))),
        matmul_efficiency=float(raw.get("matmul_efficiency", 0.5)),
        nccl_efficiency=float(raw.get("nccl_efficiency", 0.7)),
        nccl_latency_us=float(raw.get("nccl_latency_us", 30.0)),
        inter_node_bw_gbs=float(raw.get("inter_node_bw_gbs", 12.5)),
    )


@functools.cache
def load_gpu_catalog(path: Traversable | Path = CATALOG_PATH) -> dict[str, GpuType]:
    """All GPU types of the catalog file (the packaged one unless given), by name."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not data:
        raise SpecError("gpus", f"{path} holds no GPU types")
    return {name: _parse(name, raw) for name, raw in data.items()}


def get_gpu(name: str) -> GpuType:
    """Look one GPU type up by name (case-insensitive), with a did-you-mean on error."""
    catalog = load_gpu_catalog()
    for key, gpu in catalog.items():
        if key.lower() == name.strip().lower():
            return gpu
    close = difflib.get_close_matches(name, catalog, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise SpecError("gpu", f"unknown GPU type {name!r}.{hint} Known: {', '.join(catalog)}")
