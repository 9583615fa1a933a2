"""The Megatron CI rows with an accounted pipeline split and with Megatron-FSDP are
expressed as ``frenzy memory`` specs; the fp8 rows stay skipped with their reason."""

from __future__ import annotations

import pytest

from benchmarks import real_memory
from predictor.memory_spec import parse_memory_spec


@pytest.fixture(scope="module")
def rows() -> list[real_memory.RealRow]:
    try:
        return real_memory.load_rows()
    except FileNotFoundError:
        pytest.skip("shared real_memory data not present")


def test_accounted_interleaved_rows_build_megatrons_chunks(rows: list) -> None:
    split = [r for r in rows if "account_for_embedding_loss" in r.row_id]
    # 5 CSV rows: 4 with dp 2 (8 GPUs) merged, the 1-node GB200 one with dp 1
    assert sum(r.duplicates for r in split) == 5 and not any(r.skip for r in split)
    for r in split:
        # 6 layers + embedding + loss = 8 over pp 4 x 2 chunks: 1 each, the first and the
        # last chunk empty
        assert parse_memory_spec(r.spec).chunks == ((0, 1), (1, 1), (1, 1), (1, 0))


def test_megatron_fsdp_rows_are_zero3_with_its_sharding(rows: list) -> None:
    fsdp = [r for r in rows if "fsdp_dtensor" in r.row_id]
    assert sum(r.duplicates for r in fsdp) == 4 and not any(r.skip for r in fsdp)
    for r in fsdp:
        req = parse_memory_spec(r.spec)
        assert req.par.zero_stage == 3 and req.runtime.sharding == "megatron_fsdp"
        assert req.par.tp == 2 and req.par.dp * req.par.tp in (4, 8)


def test_fp8_rows_stay_skipped_with_the_reason(rows: list) -> None:
    fp8 = [r for r in rows if "native_fp8" in r.row_id]
    assert len(fp8) == 4
    assert all(r.skip.startswith("fp8 training (not modelled") and "Hopper" in r.skip
               for r in fp8)
