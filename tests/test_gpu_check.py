"""scripts/gpu-check.sh on a machine without a GPU: it says so, writes a summary saying so, exits 2."""

import json
import subprocess
import sys

import pytest
import torch

from launch_support import REPO, clean_env


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")
def test_gpu_check_without_a_gpu_says_so_and_fails(tmp_path):
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), str(tmp_path)], capture_output=True,
                            text=True, timeout=120, env=clean_env(PYTHON=sys.executable), cwd=tmp_path)
    assert result.returncode == 2
    assert "gpu-check: no CUDA GPU found" in result.stderr and "nothing was run" in result.stderr
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    assert summary["tests"] == [] and summary["benches"] == []
    assert summary["machine"]["cuda_available"] is False and "nothing was run" in summary["machine"]["note"]
    assert "nothing was run" in (tmp_path / "gpu-check.md").read_text()
    assert not (tmp_path / "gpu-check-junit.xml").exists()
