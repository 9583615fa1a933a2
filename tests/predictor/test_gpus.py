"""The GPU catalog data file: every required type, with sources and sane figures."""

from __future__ import annotations

import pytest

from predictor.errors import SpecError
from predictor.gpus import GIB, get_gpu, load_gpu_catalog, resolve_gpu
from predictor.spec import Precision

REQUIRED = ["V100-32G", "RTX2080Ti", "RTX3090", "RTX6000", "A10", "A100-40G", "A100-80G",
            "A800-80G", "L40S", "H100-80G", "H200"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_types_present_with_source(name: str) -> None:
    gpu = get_gpu(name)
    assert gpu.source.strip()
    assert gpu.fp16_tflops > 0 and gpu.memory_bytes > 8 * GIB
    assert gpu.link in ("nvlink", "pcie") and gpu.link_bw_gbs > 0


def test_figures_from_reference_table() -> None:
    assert get_gpu("A100-80G").bf16_tflops == 312
    assert get_gpu("H100-80G").bf16_tflops == 989
    assert get_gpu("A800-80G").link_bw_gbs < get_gpu("A100-80G").link_bw_gbs  # 400 vs 600 GB/s
    assert get_gpu("RTX2080Ti").memory_gib == pytest.approx(11, abs=0.01)
    assert not get_gpu("V100-32G").supports(Precision.BF16)
    assert get_gpu("V100-32G").peak_tflops(Precision.FP16) == 125


def test_lookup_is_case_insensitive_and_errors_suggest() -> None:
    assert get_gpu("a100-80g").name == "A100-80G"
    with pytest.raises(SpecError) as exc:
        get_gpu("A100-81G")
    assert "A100-80G" in exc.value.reason
    assert len(load_gpu_catalog()) >= len(REQUIRED)


def test_types_the_real_memory_data_covers() -> None:
    # datasheet figures: V100 SXM2 16 GB, H800 (H100 compute, NVLink 400 GB/s), H100 NVL
    # 94 GB, GH200 96 GB HBM3 at 4 TB/s, GB200 186 GB per GPU
    assert get_gpu("V100-16G").memory_gib == 16 and not get_gpu("V100-16G").supports(
        Precision.BF16)
    assert get_gpu("V100-16G").cuda_context_bytes == 1343 << 20  # measured (HF docs)
    assert get_gpu("H800-80G").bf16_tflops == 989 and get_gpu("H800-80G").link_bw_gbs == 200
    assert get_gpu("H100-NVL").memory_gib == 94
    assert get_gpu("GH200-96G").mem_bw_gbs == 4000
    assert get_gpu("GH200-144G").mem_bw_gbs == 4900
    assert get_gpu("GB200").memory_gib == 186
    # types without their own figure keep the old single overhead as their context
    assert get_gpu("A100-80G").cuda_context_bytes == get_gpu("A100-80G").runtime_overhead_bytes


@pytest.mark.parametrize(("entry", "mib"), [
    # nvidia-smi's memory.total as public nvidia-smi outputs print it, not the datasheet's GB:
    # "81559MiB" on every "NVIDIA H100 80GB HBM3" and "NVIDIA H800", "97871 MiB" on an
    # "NVIDIA GH200 120GB" (CSV query), 46068 / 23028 MiB on an L40S / A10 (Modal's list);
    # the GH200 144G's figure is CUDA's cuDeviceTotalMem, 153,008,209,920 bytes
    ("H100-80G", 81559), ("H800-80G", 81559), ("GH200-96G", 97871), ("L40S", 46068),
    ("A10", 23028), ("GH200-144G", 153008209920 / 2**20), ("A100-80G", 81920),
    ("H200", 143771),
])
def test_capacity_is_what_the_driver_reports(entry: str, mib: float) -> None:
    assert get_gpu(entry).memory_bytes == mib * 2**20


@pytest.mark.parametrize(("written", "entry"), [
    # torch.cuda.get_device_name / nvidia-smi spellings of the parts
    ("NVIDIA H100 80GB HBM3", "H100-80G"), ("NVIDIA A100-SXM4-40GB", "A100-40G"),
    ("NVIDIA A100-SXM4-80GB", "A100-80G"), ("Tesla V100-SXM2-16GB", "V100-16G"),
    ("Tesla V100-SXM2-32GB", "V100-32G"), ("Tesla T4", "T4"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA GeForce RTX 2080 Ti", "RTX2080Ti"), ("Quadro RTX 6000", "RTX6000"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA A10", "A10"), ("NVIDIA H200", "H200"),
    # the superchip's name counts Grace's LPDDR5X: 480 GB is the 96 GB HBM3 part
    ("NVIDIA GH200 480GB", "GH200-96G"), ("GH200", "GH200-96G"),
    # ... and so does 120 GB (Alps, Isambard); the HBM3e part names its memory type
    ("NVIDIA GH200 120GB", "GH200-96G"), ("NVIDIA GH200 144G HBM3e", "GH200-144G"),
    ("GH200 HBM3e", "GH200-144G"), ("GH200 96GB", "GH200-96G"),
    # data sheets and the real-memory sources' gpu column
    ("H800 (80GB)", "H800-80G"), ("H100 96GB HBM2e (Meta Grand Teton, 500 W)", "H100-96G"),
    ("A100 80GB", "A100-80G"), ("GB200 (Blackwell GPU, ~186 GB HBM3e; GB200 NVL72)", "GB200"),
    ("a800-80g", "A800-80G"),
])
def test_device_names_resolve_to_their_catalog_entry(written: str, entry: str) -> None:
    assert resolve_gpu(written).name == entry


@pytest.mark.parametrize(("written", "hint"), [
    ("H100", "H100-80G (80 GiB), H100-96G (96 GiB)"),  # two sizes: the user must say which
    ("V100", "V100-32G"),
    ("A100 24GB", "fits no catalog type by its size"),
    ("NVIDIA A100 80GB PCIe", "NVLink (SXM) part"),  # not priced as the SXM part silently
    ("NVIDIA A10G", "Known: "),  # AWS's A10G is not the A10
    ("B200", "Did you mean"),
])
def test_names_that_fit_no_or_several_entries_say_what_would(written: str, hint: str) -> None:
    with pytest.raises(SpecError) as exc:
        resolve_gpu(written)
    assert exc.value.field == "gpu" and hint in exc.value.reason
