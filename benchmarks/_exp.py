import os, sys, torch
sys.path.insert(0, "benchmarks")
from bench_op import graphed
from common import bench
import torch.nn.functional as F
import flash_eqlinear
op = torch.ops.flash_eqlinear.eq_linear_fwd
for dt in (torch.float16, torch.bfloat16):
  for c in map(int, sys.argv[1].split(",")):
    M = 32768
    x = [(torch.randn(M, 4 * c, device="cuda").to(dt),) for _ in range(4 if c < 1024 else 1)]
    planes = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt)
    b = torch.randn(c, device="cuda").to(dt)
    W = torch.randn(4 * c, 4 * c, device="cuda").to(dt)
    res = {"F.linear": bench(graphed(lambda x: F.linear(x, W), x), [()], 0.3) / len(x)}
    res["flash"] = bench(graphed(lambda x: op(x, planes, b), x), [()], 0.3) / len(x)
    print(f"{dt} c={c}: " + "  ".join(f"{k} {v:.4f}" for k, v in res.items()) + f"  x {res['F.linear']/res['flash']:.2f}", flush=True)
