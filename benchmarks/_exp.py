import os, sys, torch
sys.path.insert(0, "benchmarks")
from bench_op import graphed
from common import bench
import torch.nn.functional as F
import flash_eqlinear
op = torch.ops.flash_eqlinear.eq_linear_fwd
VARIANTS = [("1", v) for v in sys.argv[1].split(",")] + ([("2", "c")] if len(sys.argv) > 2 else [])
for dt in (torch.float16, torch.bfloat16):
  for c in (128, 512, 2048):
    M = 32768
    x = [(torch.randn(M, 4 * c, device="cuda").to(dt),) for _ in range(4 if c < 1024 else 1)]
    planes = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt)
    b = torch.randn(c, device="cuda").to(dt)
    W = torch.randn(4 * c, 4 * c, device="cuda").to(dt)
    res = {"F.linear": bench(graphed(lambda x: F.linear(x, W), x), [()], 0.3) / len(x)}
    for cl, var in VARIANTS:
        os.environ["FLASH_EQLINEAR_SM90_CLUSTER"] = cl
        os.environ["FLASH_EQLINEAR_SM90_VARIANT"] = var
        res[f"cl{cl}-{var}"] = bench(graphed(lambda x: op(x, planes, b), x), [()], 0.3) / len(x)
    print(f"{dt} c={c}: " + "  ".join(f"{k} {v:.4f}" for k, v in res.items()), flush=True)
