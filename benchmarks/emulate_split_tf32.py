"""CPU emulation of the 3xTF32 forward's accuracy: why its GEMMs are chunked along K, and by how much.

Model of a tensor-core GEMM with FP32 accumulation: operands truncated to TF32 (the top 19 bits),
their products exact, 8 products summed per k step and the accumulator rounded toward zero to FP32
after each step (no round-to-nearest). Against it: the exact kernel's FP32 FFMA chain (round to
nearest each step). For the p4 forward's three plane products (a0, a2: K = c; the complex pair:
K = 2c) and the output y of the inverse transform, it prints the relative L2 error of y against
float64 for: the form with one GEMM per product over K = [hi | lo] (the unchunked form, whose
measured H100 errors grew linearly with c: 5e-6 / 1e-5 / 2e-5 at c = 512 / 1024 / 2048), and the
chunked form for several chunk rules, as a ratio to the FFMA error.

Usage: python benchmarks/emulate_split_tf32.py [--rows 32] [--cols 48] [--cs 512,1024,2048]
(a few minutes on two CPU cores).
"""

from __future__ import annotations

import argparse
import math

import torch

F64 = torch.float64


def rz32(v: torch.Tensor) -> torch.Tensor:
    """float64 -> nearest float32 toward zero, as float64."""
    f = v.to(torch.float32)
    over = f.to(F64).abs() > v.abs()
    f[over] = torch.nextafter(f[over], torch.zeros_like(f[over]))
    return f.to(F64)


def tf32(a: torch.Tensor, rounding: str) -> torch.Tensor:
    """FP32 values kept to TF32 precision: "trunc" (what the tensor core reads) or "rna" (the split)."""
    bits = a.to(torch.float32).view(torch.int32)
    if rounding == "rna":
        bits = bits + 0x1000
    return (bits & -8192).view(torch.float32).to(F64)


def tc_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = tf32(a, "trunc"), tf32(b, "trunc")
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=F64)
    for k0 in range(0, a.shape[1], 8):
        acc = rz32(acc + a[:, k0 : k0 + 8] @ b[k0 : k0 + 8])
    return acc


def ffma_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float32)
    for k in range(a.shape[1]):
        acc = (acc.to(F64) + torch.outer(a[:, k], b[k])).to(torch.float32)
    return acc.to(F64)


def fp32_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The GEMM epilogue's beta = 1 add: FP32, round to nearest."""
    return (a + b).to(torch.float32).to(F64)


def split_product(x: torch.Tensor, w: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """x w with x, w split into TF32 hi + lo. chunk None: the unchunked form ([xh | xl] [wh; wh],
    then + xh wl); else the corrections in one GEMM and xh wh in K chunks of `chunk`."""
    xh, wh = tf32(x, "rna"), tf32(w, "rna")
    xl, wl = x - xh, w - wh
    if chunk is None:
        return fp32_add(tc_gemm(torch.cat([xh, xl], 1), torch.cat([wh, wh])), tc_gemm(xh, wl))
    out = tc_gemm(torch.cat([xh, xl], 1), torch.cat([wl, wh]))
    for k0 in range(0, x.shape[1], chunk):
        out = fp32_add(out, tc_gemm(xh[:, k0 : k0 + chunk], wh[k0 : k0 + chunk]))
    return out


RULES = {
    "max(256, K/8)": lambda k: max(256, k // 8),
    "256": lambda k: 256,
    "128": lambda k: 128,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--cols", type=int, default=48)
    ap.add_argument("--cs", default="512,1024,2048")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    M, N = args.rows, args.cols

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(torch.float32).to(F64)

    for c in map(int, args.cs.split(",")):
        f0, f2, fr, fi = (rand(M, c) for _ in range(4))
        p0, p2, pr, pi = (rand(c, N, scale=(4 * c) ** -0.5) for _ in range(4))
        xc, wc = torch.cat([fr, fi], 1), torch.cat([torch.cat([pr, pi], 1), torch.cat([-pi, pr], 1)])

        def y_of(a0, a2, ac, N=N):
            ar, ai, h = ac[:, :N], ac[:, N:], math.sqrt(0.5)
            e, o = (a0 + a2) / 2, (a0 - a2) / 2
            return torch.cat([e + h * ar, o - h * ai, e - h * ar, o + h * ai], 1)

        exact = y_of(f0 @ p0, f2 @ p2, xc @ wc)

        def rel(y, exact=exact):
            return ((y - exact).norm() / exact.norm()).item()

        e_fma = rel(y_of(ffma_gemm(f0, p0), ffma_gemm(f2, p2), ffma_gemm(xc, wc)))
        e_old = rel(y_of(*(split_product(a, b, None) for a, b in ((f0, p0), (f2, p2), (xc, wc)))))
        line = [f"c={c}: FFMA {e_fma:.2e}, unchunked {e_old:.2e} ({e_old / e_fma:.1f}x)"]
        for name, rule in RULES.items():
            y = y_of(
                split_product(f0, p0, rule(c)),
                split_product(f2, p2, rule(c)),
                split_product(xc, wc, rule(2 * c)),
            )
            line.append(f"chunks {name}: {rel(y) / e_fma:.2f}x")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
