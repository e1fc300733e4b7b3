"""Every CUDA source in csrc/ compiles with nvcc for sm_80 and sm_90a (no GPU needed).

Kernel files include only CUDA headers, so this runs on CPU machines too; the binding file needs
torch's CUDA headers and is compiled by setup.py on GPU machines instead.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # nvcc on every kernel source: minutes on a small machine

CSRC = Path(__file__).resolve().parents[1] / "csrc"
NVCC = shutil.which("nvcc")
SOURCES = sorted(CSRC.glob("*.cu"))
ARCHS = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]


@pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH")
@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles(src, tmp_path):
    cmd = [
        NVCC,
        "-std=c++17",
        "-O3",
        "--expt-relaxed-constexpr",
        "-Werror",
        "all-warnings",
        f"-I{CSRC}",
        *ARCHS,
        "-c",
        str(src),
        "-o",
        str(tmp_path / "k.o"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"


def test_sources_present():
    assert SOURCES, "no .cu files in csrc/"
