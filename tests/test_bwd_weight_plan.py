"""The Hopper weight gradient's stream-K split (csrc/eq_linear_bwd_weight_sm90.h), checked on the host:
tests/csrc/check_sm90_stream_plan.cu walks every CTA's share as the kernel does, over a grid of sizes
and SM counts (each (tile, k tile) covered once, slab indices in order, the reduce's view of the pieces,
balance). Needs nvcc, not a GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH")
def test_sm90_stream_plan(tmp_path):
    exe = tmp_path / "check"
    src = ROOT / "tests" / "csrc" / "check_sm90_stream_plan.cu"
    cmd = [NVCC, "-std=c++17", "-O2", f"-I{ROOT / 'csrc'}", str(src), "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"{' '.join(cmd)}\n{built.stdout}\n{built.stderr}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout[-2000:] + run.stderr[-2000:]
