"""geryon bench allreduce/transport over loopback (geryon.bench.loopback): the rows it prints, and its
refusal of --device cuda where no GPU is visible. The CUDA rows are checked by scripts/gpu-check.sh."""

import pytest
import torch

from geryon.bench import loopback
from geryon.errors import ConfigError


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")
def test_device_cuda_without_a_gpu_says_so_before_starting_ranks():
    with pytest.raises(ConfigError, match="sees no CUDA GPU"):
        next(loopback.allreduce_rows("cuda", [2], [4000], 1))


@pytest.mark.slow
def test_a_cpu_row_times_geryon_and_gloo_on_the_same_loopback_ring():
    (row,) = loopback.allreduce_rows("cpu", [2], [400_000], 1)
    assert (row["workers"], row["size_bytes"], row["link"]) == (2, 400_000, "loopback")
    for system in ("geryon_cpu", "gloo_cpu"):
        assert row[f"{system}_gbps"] == pytest.approx(400_000 / row[f"{system}_seconds"] / 1e9, rel=0.01)
        assert row[f"{system}_cpu_s_per_gb"] > 0
    assert row["ratio_vs_gloo_cpu"] == pytest.approx(row["geryon_cpu_seconds"] / row["gloo_cpu_seconds"], rel=0.01)
    assert "hidden_share" not in row


@pytest.mark.cuda
def test_a_cuda_row_compares_staged_cuda_tensors_with_cpu_tensors_and_gloo():
    (row,) = loopback.allreduce_rows("cuda", [2], [4_000_000], 2)
    for system in ("geryon_cuda", "geryon_cpu", "gloo_cuda"):
        assert row[f"{system}_seconds"] > 0
    assert 0.0 <= row["hidden_share"] <= 1.0 and row["copy_seconds"] > 0
    assert row["ratio_cuda_vs_cpu"] == pytest.approx(row["geryon_cuda_seconds"] / row["geryon_cpu_seconds"], rel=0.01)
