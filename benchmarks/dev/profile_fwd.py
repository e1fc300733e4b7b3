"""One forward launch per case, for profilers: python benchmarks/dev/profile_fwd.py DTYPE C [M] [repeats].

Example: ncu --kernel-name regex:sm90 --launch-skip 2 --launch-count 1 --set full \
    python benchmarks/dev/profile_fwd.py fp16 2048
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the package from the repository root
import flash_eqlinear  # noqa: E402, F401  (registers the ops)

dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[sys.argv[1]]
c = int(sys.argv[2])
M = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
x = torch.randn(M, 4 * c, device="cuda").to(dt)
planes = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt)
bias = torch.randn(c, device="cuda").to(dt)
for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 4):
    torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, bias)
torch.cuda.synchronize()
