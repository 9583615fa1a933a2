"""The GPU catalog: memory, dense tensor throughput and links per GPU type.

The data lives in ``predictor/data/gpus.yaml`` (package data, read with ``importlib.resources``
so an installed wheel has it) with a source for every figure; this module only reads it (once,
cached) into frozen ``GpuType`` values.
"""

from __future__ import annotations

import difflib
import functools
import re
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
    """Look one GPU type up by its catalog name (case-insensitive), with a did-you-mean on
    error. Internal names (cluster files, node labels, plans) go through here: they must be
    the catalog's own spelling, since they are compared as strings later."""
    gpu = _by_catalog_name(name)
    if gpu is not None:
        return gpu
    catalog = load_gpu_catalog()
    close = difflib.get_close_matches(name, catalog, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise SpecError("gpu", f"unknown GPU type {name!r}.{hint} Known: {', '.join(catalog)}")


def _by_catalog_name(name: str) -> GpuType | None:
    """The catalog entry named ``name`` (case-insensitive, outer spaces ignored), or None."""
    wanted = name.strip().lower()
    return next((g for k, g in load_gpu_catalog().items() if k.lower() == wanted), None)


# GPU families as device names spell them, most specific first ("GH200" before "H200").
_FAMILIES: tuple[tuple[str, str], ...] = (
    ("GH200", r"GH\s*200"), ("GB200", r"GB\s*200"), ("H100", r"H\s*100"), ("H200", r"H\s*200"),
    ("H800", r"H\s*800"), ("A100", r"A\s*100"), ("A800", r"A\s*800"), ("V100", r"V\s*100"),
    ("L40S", r"L\s*40\s*S"), ("A10", r"A\s*10(?![0-9G])"), ("T4", r"(?<![A-Z0-9])T\s*4(?![0-9])"),
    ("RTX3090", r"RTX\s*3090"), ("RTX2080TI", r"RTX\s*2080\s*TI"), ("RTX6000", r"RTX\s*6000"),
)
_VENDOR_WORDS = re.compile(r"\b(NVIDIA|TESLA|GEFORCE|QUADRO)\b")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*G(?:I?B)?\b")
# A Grace Hopper superchip's device name counts the CPU's memory too ("NVIDIA GH200 480GB"
# is the 96 GB HBM3 part): sizes above this are not the GPU's.
_MAX_GPU_GB = 200.0
# Superchips whose device names give the Grace CPU's LPDDR5X, not the GPU's memory: the HBM3
# part appears as "NVIDIA GH200 120GB" or "... 480GB", the HBM3e part as "NVIDIA GH200 144G
# HBM3e". A size no entry of the family has is the CPU's; without a GPU size the name is the
# part its memory type says (the HBM3 one unless "HBM3e" is written).
_GRACE_PARTS: dict[str, tuple[str, str]] = {"GH200": ("GH200-96G", "GH200-144G")}


def _family(text: str) -> str | None:
    for fam, pattern in _FAMILIES:
        if re.search(pattern, text):
            return fam
    return None


def _sizes_gb(text: str) -> list[float]:
    return [float(m) for m in _SIZE.findall(text) if float(m) <= _MAX_GPU_GB]


def _size_matches(gb: float, gpu: GpuType) -> bool:
    """Whether a size as written ("80GB", "96 GiB", "16GB" of a T4 whose driver reports
    15.1 GiB) is this GPU's memory: the catalog name's own figure, or the capacity within
    4 % read as GB or as GiB."""
    own = _sizes_gb(gpu.name.upper().replace("-", " ").replace("G", "GB"))
    if own:
        return any(abs(gb - o) < 0.5 for o in own)
    return any(abs(gb - gpu.memory_bytes / unit) <= 0.04 * gb for unit in (1e9, GIB))


def resolve_gpu(name: str) -> GpuType:
    """A GPU type from a name as users and tools write it: the catalog name, or a device
    name as ``nvidia-smi`` / ``torch.cuda.get_device_name`` print it ("NVIDIA H100 80GB
    HBM3", "Tesla V100-SXM2-16GB", "NVIDIA GH200 120GB"), or a data sheet's ("H800 (80GB)").
    The family and the memory size decide; a name that fits several catalog types
    ("H100": 80 or 96 GB), a PCIe card where the catalog holds only the NVLink part, or a
    family the catalog lacks is an error naming what would fit."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError("gpu", f"must be a GPU type name, got {name!r}; "
                        f"known: {', '.join(load_gpu_catalog())}")
    exact = _by_catalog_name(name)
    if exact is not None:
        return exact
    catalog = load_gpu_catalog()
    text = _VENDOR_WORDS.sub(" ", name.upper().replace("_", " "))
    fam = _family(text)
    same = [g for g in catalog.values() if _family(g.name.upper()) == fam] if fam else []
    if not same:
        get_gpu(name)  # raises with the did-you-mean
    cands = same
    if any("NVL" in g.name.upper() for g in same):  # H100 NVL vs SXM; GB200 "NVL72" is a rack
        nvl = "NVL" in text
        cands = [g for g in same if ("NVL" in g.name.upper()) == nvl]
    sizes = _sizes_gb(text)
    if fam in _GRACE_PARTS:
        sizes = [s for s in sizes if any(_size_matches(s, g) for g in same)]
        if not sizes:
            hbm3, hbm3e = _GRACE_PARTS[fam]
            cands = [g for g in cands if g.name == (hbm3e if "HBM3E" in text else hbm3)]
    if sizes:
        cands = [g for g in cands if any(_size_matches(s, g) for s in sizes)]
    if "PCIE" in text.replace(" ", ""):
        sxm_only = [g for g in cands if g.link == "nvlink"]
        if sxm_only and len(sxm_only) == len(cands):
            raise SpecError("gpu", f"{name!r} is a PCIe card; the catalog holds "
                            f"{', '.join(g.name for g in sxm_only)} as the NVLink (SXM) part, "
                            "whose links and clocks differ. Name it to price the job with "
                            "that part's figures")
    if len(cands) == 1:
        return cands[0]
    options = cands or same
    what = "fits several catalog types" if cands else "fits no catalog type by its size"
    raise SpecError("gpu", f"{name!r} {what}; name one of: "
                    f"{', '.join(f'{g.name} ({g.memory_bytes / GIB:.0f} GiB)' for g in options)}")
