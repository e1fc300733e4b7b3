"""Fused p4 forward kernels on CUDA: exactness per dtype against float64, robustness, op checks.

Criterion (flash-attention style): the relative L2 error of our low-precision output against the
float64 naive layer is at most twice that of F.linear on the same low-precision input and the
layer's dense weight rounded to the same dtype. For tiny outputs F.linear can be exact by luck,
so its error is floored at u/8 (u = unit roundoff); FP32 must stay under 1e-5.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from conftest import (
    check_against_linear,
    check_export,
    debug_env,
    fp64_grads,
    fp64_reference,
    launched_kernels,
    make,
    rel_l2,
    require_cuda_kernels,
)

import flash_eqlinear as fe
from flash_eqlinear import reference
from flash_eqlinear.ops import backend_for

require_cuda_kernels()

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [1, 3, 16, 48, 59, 64, 200, 1025]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 7, 129, 4097])
@pytest.mark.parametrize("c", SIZES)
@pytest.mark.parametrize("d", SIZES)
def test_forward_matches_fp64(M, c, d, dtype):
    x, planes, b = make(M, c, d, dtype, seed=M * 7919 + c * 31 + d)
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
    assert y.shape == (M, 4 * d)
    check_against_linear(y, x, planes, b)


# Shapes the sm_90a kernel takes (c % 8 == 0, d even): ragged M, c not a multiple of its 32-channel
# k tile, d not a multiple of its 64-channel tile, one full 128 x 64 tile, long K, many tiles.
SM90_SHAPES = [
    (1, 8, 2),
    (7, 16, 16),
    (129, 48, 200),
    (300, 200, 64),
    (128, 64, 64),
    (4097, 64, 48),
    (1000, 520, 136),
    (255, 2048, 70),
    (20000, 64, 130),  # more tiles than SMs: each persistent block walks several
]


@pytest.mark.parametrize("path", ["sm90", "sm90-cluster", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M, c, d", SM90_SHAPES)
def test_forward_each_path(M, c, d, dtype, path, monkeypatch):
    # FLASH_EQLINEAR_SM90=0 forces the portable mma.sync kernel where the sm_90a one would run
    # (elsewhere both settings run the portable kernel); FLASH_EQLINEAR_DEBUG=sm90_cluster=2 the sm_90a
    # kernel in clusters of two. Each path: fp64 criterion, bitwise repeatable.
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0" if path == "portable" else "1")
    debug_env(monkeypatch, sm90_cluster="2" if path == "sm90-cluster" else "1")
    debug_env(monkeypatch, narrow="0")  # small shapes would take the narrow kernel
    x, planes, b = make(M, c, d, dtype, seed=M + 3 * c + 7 * d)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    y = op(x, planes, b)
    check_against_linear(y, x, planes, b)
    assert torch.equal(op(x, planes, b), y)
    x = (x.float() / x.float().abs().max() * 3e4).to(dtype)  # fp16: the halved prologue keeps this finite
    check_against_linear(op(x, planes, None), x, planes, None)


def in_clusters(kernel_name: str) -> bool:
    """Whether a Hopper forward kernel's name is that of its clusters-of-two variant (kCl = 2, the
    third template argument)."""
    return re.search(r"eq_linear_fwd_sm90_kernel<[^,]+, \w+, 2[,>]", kernel_name) is not None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M, c, d", SM90_SHAPES + [(20000, 8, 130), (20000, 40, 190)])
def test_forward_clusters(M, c, d, dtype, monkeypatch):
    # Clusters of two CTAs sharing x (FLASH_EQLINEAR_DEBUG=sm90_cluster=2) launch their own kernel and give
    # the single-CTA kernel's output bit for bit (same fragments, same wgmma order); an odd count of
    # n tiles leaves the last cluster's second CTA a tile past d.
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm_90a kernel only")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1")
    debug_env(monkeypatch, narrow="0")
    x, planes, b = make(M, c, d, dtype, seed=M + 5 * c + 3 * d)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    debug_env(monkeypatch, sm90_cluster="1")
    y1 = op(x, planes, b)
    debug_env(monkeypatch, sm90_cluster="2")
    out = []
    names = launched_kernels(lambda: out.append(op(x, planes, b)))
    kernels = [n for n in names if "eq_linear_fwd_sm90_kernel" in n]
    if (d + 63) // 64 > 1:
        assert kernels and all(in_clusters(n) for n in kernels), names
    assert torch.equal(out[0], y1)


CLUSTER_DEFAULT_CASES = [(192, 192, False), (768, 192, False), (192, 576, False), (512, 256, False)]
CLUSTER_DEFAULT_CASES += [(192, 512, True), (256, 1024, True)]


@pytest.mark.parametrize("c, d, clusters", CLUSTER_DEFAULT_CASES)
def test_forward_cluster_default(c, d, clusters, monkeypatch):
    # Without the switch, 16-bit layers run in clusters of two only with an even count of at least 8 n
    # tiles of 64 channels: an odd count would compute a tile past d (ViT-B's d = 192 and 576), and few
    # tiles measured slower in clusters (docs/performance.md).
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm_90a kernel only")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1")
    debug_env(monkeypatch, sm90_cluster=None)
    x, planes, b = make(1000, c, d, torch.bfloat16, seed=c + d)
    names = launched_kernels(lambda: torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b))
    kernels = [n for n in names if "eq_linear_fwd_sm90_kernel" in n]
    assert len(kernels) == 1 and in_clusters(kernels[0]) == clusters, names


# Shapes of the narrow kernel (c, d <= 32): both warp tiles (d <= 16: 16 rows, else 8), both K widths
# (c <= 16, else 32), c and d odd (the FFMA variant for fp16 / bf16 too), ragged M.
NARROW_SHAPES = [(1, 1, 1), (7, 3, 5), (129, 16, 16), (4097, 16, 8), (300, 7, 32), (1000, 32, 32)]
NARROW_SHAPES += [(257, 20, 31), (513, 32, 16), (65, 2, 2), (4097, 8, 14)]  # fp16 / bf16 d <= 16: mma.sync
NARROW_SHAPES += [(129, 16, 32), (77, 6, 24)]  # fp16 / bf16 mma.sync with four n8 tiles
# Exact FP32 only: the KC = 64 / DN = 64 tiles (c or d in 33 .. 64), taken when forced.
NARROW_FP32_SHAPES = [(1000, 64, 64), (257, 48, 59), (129, 33, 64), (4097, 64, 20), (77, 40, 36), (5, 63, 1)]
NARROW_CASES = [(*s, dt) for s in NARROW_SHAPES for dt in DTYPES]
NARROW_CASES += [(*s, torch.float32) for s in NARROW_FP32_SHAPES]


@pytest.mark.parametrize("narrow", [True, False], ids=["narrow", "tiled"])
@pytest.mark.parametrize("M, c, d, dtype", NARROW_CASES, ids=str)
def test_forward_narrow(M, c, d, dtype, narrow, monkeypatch):
    # FLASH_EQLINEAR_DEBUG=narrow=1 forces the narrow kernel (c, d <= 32; FP32 up to 64), =0 the tiled
    # kernels. Each: fp64 criterion, bitwise repeatable, no bias, fp16-range inputs, and x at an
    # 8-byte offset (the element-access path).
    debug_env(monkeypatch, narrow="1" if narrow else "0")
    x, planes, b = make(M, c, d, dtype, seed=M + 5 * c + 11 * d)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    y = op(x, planes, b)
    check_against_linear(y, x, planes, b)
    assert torch.equal(op(x, planes, b), y)
    check_against_linear(op(x, planes, None), x, planes, None)
    big = (x.float() / x.float().abs().max() * 3e4).to(dtype)
    check_against_linear(op(big, planes, b), big, planes, b)
    x_off = torch.empty(M * 4 * c + 4, device=DEV, dtype=dtype)[4:].view(M, 4 * c)
    x_off.copy_(x)
    check_against_linear(op(x_off, planes, b), x_off, planes, b)


@pytest.mark.parametrize("c, d, narrow", [(16, 16, True), (8, 32, True), (32, 32, False), (16, 32, False)])
def test_narrow_dispatch_under_tf32(c, d, narrow, allow_tf32):
    # With TF32 allowed the narrow kernel (exact FP32) takes layers up to c * d = 256, the TF32
    # kernels the rest: the error tells which ran.
    x, planes, b = make(4097, c, d, torch.float32)
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
    err = rel_l2(y, fp64_reference(x, planes, b)[0])
    assert (err < 1e-6) == narrow, err


# (c, d, narrow kernel by default)
WIDE_NARROW_DISPATCH = [(32, 64, 1), (64, 32, 1), (16, 48, 1), (48, 48, 0), (64, 64, 0), (40, 33, 0)]


@pytest.mark.parametrize("c, d, narrow", WIDE_NARROW_DISPATCH)
def test_fp32_dispatch_of_the_wide_narrow_tiles(c, d, narrow, monkeypatch):
    # Exact FP32 takes the narrow kernel's 64-wide tiles by default only where one of c, d <= 32 (where
    # they beat the tiled kernel on an H100). Both kernels are exact and gave bitwise-equal results
    # here, so the result does not tell which ran: the profiler's kernel names do.
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the 64-wide FP32 tiles need an H100-class shared memory")
    debug_env(monkeypatch, narrow=None, fp32_tile=None)
    monkeypatch.delenv("FLASH_EQLINEAR_FP32", raising=False)
    x, planes, b = make(4097, c, d, torch.float32)
    names = launched_kernels(lambda: torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b))
    assert any("eq_linear_fwd" in n for n in names), names
    assert any("narrow" in n for n in names) == bool(narrow), names


# FP32 tile configurations of eq_linear_fwd_fp32.cu: TileCfg's template arguments (the last: operand
# planes, 5 where the complex term takes three products).
FP32_TILES = {
    "big": (4, 2, 8, 4, 8, 1, 5),
    "small": (4, 1, 4, 4, 8, 3, 5),
    "small4": (4, 1, 4, 4, 8, 4, 4),
}


def ran_tile(names, tile):
    """Whether one of the kernel names (demangled or mangled) is the FP32 kernel with this tile."""
    args = FP32_TILES[tile]
    spelled = ("TileCfg<" + ",".join(map(str, args)) + ">", "TileCfgI" + "".join(f"Li{a}E" for a in args))
    return any(form in n.replace(" ", "") for n in names for form in spelled)


@pytest.mark.parametrize("tile", list(FP32_TILES))
@pytest.mark.parametrize("M, c, d", [(4097, 59, 200), (129, 64, 64), (3001, 3, 48), (7, 200, 33)])
def test_fp32_tile_configs(M, c, d, tile, monkeypatch):
    # FLASH_EQLINEAR_DEBUG=fp32_tile=... forces each exact-FP32 tile: each under 1e-5 against float64
    # (ragged rows, channels and k tails; one k tile for c = 3), and the profiler shows the forced one ran.
    debug_env(monkeypatch, narrow="0", fp32_tile=tile)
    x, planes, b = make(M, c, d, torch.float32, seed=M + c + d)
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
    assert rel_l2(y, fp64_reference(x, planes, b)[0]) < 1e-5
    names = launched_kernels(lambda: torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b))
    assert ran_tile(names, tile), names
    x_off = torch.empty(M * 4 * c + 1, device=DEV)[1:].view(M, 4 * c).copy_(x)  # 4-byte offset: scalar path
    assert torch.equal(torch.ops.flash_eqlinear.eq_linear_fwd(x_off, planes, b), y)


@pytest.mark.parametrize("tile", ["big", "small"])
def test_fp32_three_product_error(tile, monkeypatch):
    # The big and small tiles take the complex term as three products: k1 = (fR + fI) PR,
    # k2 = fR (PI - PR), k3 = fI (PR + PI), aR = k1 - k3, aI = k1 + k2. Their rounding error is that
    # of larger partial sums where aR cancels (fR PR = fI PI): x with fR = fI and planes with PI = PR
    # make aR ~ 0 from k1 ~ k3 ~ 2 fI PR. The error must stay within 3x of the four-product small4
    # tile's on the same inputs, and under the FP32 bar, there and on plain random data. The method is
    # stable normwise, not componentwise: on the cancelling aR alone (y0 = h aR without bias, P0 and
    # P2, ~1e-3 of aI) its relative error measured 19x small4's (8.2e-4 against 4.3e-5, H100, aa27368),
    # held here to 40x (FLASH_EQLINEAR_DEBUG=fp32_tile=small4 keeps four products).
    debug_env(monkeypatch, narrow="0")
    M, c, d = 2048, 256, 96
    x, planes, b = make(M, c, d, torch.float32, seed=7)
    xq = x.view(M, c, 4).clone()
    xq[..., 3] = xq[..., 0] - xq[..., 2] + xq[..., 1]  # fI = x3 - x1 = x0 - x2 = fR
    adversarial = planes.clone()
    adversarial[2] = adversarial[1] * (1 + 1e-3 * torch.randn_like(adversarial[1]))  # PI ~ PR
    adversarial[0] = adversarial[3] = 0  # y from the complex term alone
    for xx, pp, bb in ((x, planes, b), (xq.view(M, 4 * c), adversarial, None)):
        ref = fp64_reference(xx, pp, bb)[0]
        errs, errs_ar = {}, {}
        for t in (tile, "small4"):
            debug_env(monkeypatch, fp32_tile=t)
            y = torch.ops.flash_eqlinear.eq_linear_fwd(xx, pp, bb)
            errs[t] = rel_l2(y, ref)
            errs_ar[t] = rel_l2(y.view(M, d, 4)[..., 0], ref.view(M, d, 4)[..., 0])
        assert errs[tile] < 1e-5 and errs[tile] <= 3 * errs["small4"] + 1e-8, errs
        assert errs_ar[tile] <= 40 * errs_ar["small4"] + 1e-8, errs_ar


def test_fp32_weight_grad_three_product_cancellation(monkeypatch):
    # The exact-FP32 weight gradient takes the complex pair as three products. Where grad_PR cancels
    # (x with fI = fR, grad_y with g3 ~ g1 - g0 + g2: the gradient's aR and aI parts opposite, so
    # grad_PR ~ 1e-3 of grad_PI), its error on grad_PR stays within 3x of the four-product GEMM
    # form's (exact FP32 cuBLAS GEMMs) against float64, and under the FP32 bar on the other planes.
    M, c, d = 4096, 96, 80
    x, planes, b = make(M, c, d, torch.float32, seed=11)
    xq = x.view(M, c, 4).clone()
    xq[..., 3] = xq[..., 0] - xq[..., 2] + xq[..., 1]  # fI = fR
    g = torch.randn(M, d, 4, device=DEV, generator=torch.Generator(device=DEV).manual_seed(12))
    g[..., 3] = (g[..., 1] - g[..., 0] + g[..., 2]) * (1 + 1e-3 * torch.randn_like(g[..., 0]))
    xx, gg = xq.view(M, 4 * c), g.view(M, 4 * d)
    _, want, _ = fp64_grads(xx, planes, b, gg)
    assert want[1].norm() < 1e-2 * want[2].norm()  # the cancellation is there
    errs = {}
    for gemm in (False, True):
        debug_env(monkeypatch, weight_grad="gemm" if gemm else "fused")
        _, gp, _ = torch.ops.flash_eqlinear.eq_linear_bwd(gg, xx, planes, False, True, False)
        errs[gemm] = [rel_l2(gp[i], want[i]) for i in range(4)]
    assert errs[False][1] <= 3 * errs[True][1] + 1e-8, errs
    assert max(errs[False][i] for i in (0, 2, 3)) < 1e-5, errs


@pytest.mark.parametrize("c, tile", [(64, "small4"), (256, "small4"), (512, "big"), (1024, "big")])
def test_fp32_tile_by_k(c, tile, monkeypatch):
    # Default rule with a full grid: the four-block small tile up to c = 256, the big one for longer K.
    debug_env(monkeypatch, narrow="0", fp32_tile=None)
    x, planes, b = make(32768, c, c, torch.float32)
    names = launched_kernels(lambda: torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b))
    assert ran_tile(names, tile), names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_views(dtype):
    # x at an 8-byte offset and bias at a 2-byte offset: the vectorised / TMA paths must step aside.
    M, c, d = 129, 64, 72
    x_full, planes, _ = make(M + 1, c, d, dtype)
    x = x_full.flatten()[4 : 4 + M * 4 * c].view(M, 4 * c)
    b = torch.randn(d + 1, device=DEV).to(dtype)[1:]
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
    check_against_linear(y, x, planes, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_no_bias_and_unwritten_outputs(dtype):
    x, planes, _ = make(300, 59, 200, dtype)
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, None)
    check_against_linear(y, x, planes, None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4097, 1025, 200), (129, 64, 64), (32768, 256, 256)])
def test_bitwise_reproducible(shape, dtype):
    x, planes, b = make(*shape, dtype)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    y0 = op(x, planes, b)
    for _ in range(3):
        assert torch.equal(op(x, planes, b), y0)


# (dtype, c = d, switches, kernel-name fragment): the forward kernels launched with programmatic
# dependent launch on sm_90+ (the Hopper kernel alone and in clusters, the narrow kernel's FFMA and
# mma.sync variants, the FP32 tiles).
PDL_CASES = [
    (torch.float16, 64, {"sm90_cluster": "1"}, "eq_linear_fwd_sm90_kernel"),
    (torch.bfloat16, 256, {"sm90_cluster": "2"}, "eq_linear_fwd_sm90_kernel"),
    (torch.float16, 16, {"narrow": "1"}, "narrow_mma"),
    (torch.float32, 32, {"narrow": "1"}, "eq_linear_fwd_narrow_kernel"),
    (torch.float32, 64, {"narrow": "0"}, "eq_linear_fwd_fp32_kernel"),
]


@pytest.mark.parametrize("dtype, c, switches, kernel", PDL_CASES, ids=str)
def test_dependent_launches_in_a_chain(dtype, c, switches, kernel, monkeypatch):
    # y <- layer(y), 12 times, only the current y alive: each launch reads the previous one's output,
    # and the caching allocator hands it the buffer that launch before that read. A kernel touching
    # memory before its grid-dependency wait would read stale inputs or overwrite live ones. Eager and
    # graph-replayed chains with programmatic dependent launch must equal the chain without it bit for bit.
    if "sm90" in kernel and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm_90a kernel only")
    debug_env(monkeypatch, **switches)
    x, planes, b = make(8192, c, c, dtype, seed=c)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    planes = planes * 0.5  # keeps 12 layers' outputs in range

    def chain(y):
        for _ in range(12):
            y = op(y, planes, b)
        return y

    debug_env(monkeypatch, pdl="0")
    want = chain(x)
    debug_env(monkeypatch, pdl="1")
    assert any(kernel in n for n in launched_kernels(lambda: chain(x))), kernel
    for _ in range(3):
        assert torch.equal(chain(x), want)
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    chain(static_x)  # warm-up outside capture
    with torch.cuda.graph(graph):
        static_y = chain(static_x)
    for _ in range(3):
        graph.replay()
        assert torch.equal(static_y, want)


@pytest.mark.parametrize("c", [64, 59])
def test_fp16_large_inputs_finite(c):
    # x0+x1+x2+x3 overflows fp16 for |x| > 16384; the kernel's prologue must not.
    x, planes, b = make(513, c, 64, torch.float16)
    x = (x.float() / x.float().abs().max() * 3e4).half()
    assert x.abs().max().item() >= 2.9e4
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
    check_against_linear(y, x, planes, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_more_than_2_31_elements(dtype):
    c = d = 16
    M = 2**31 // (4 * c) + 1000  # x and y each hold more than 2^31 elements
    free = torch.cuda.mem_get_info()[0]
    need = 2 * M * 4 * c * torch.finfo(dtype).bits // 8
    if free < 1.5 * need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    x = torch.empty(M, 4 * c, device=DEV, dtype=dtype)
    x[:] = torch.randn(4096, 4 * c, device=DEV, dtype=dtype).repeat(M // 4096 + 1, 1)[:M]
    _, planes, b = make(1, c, d, dtype)
    y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
    for rows in (slice(0, 64), slice(M - 64, M), slice(2**31 // (4 * d) - 32, 2**31 // (4 * d) + 32)):
        check_against_linear(y[rows], x[rows], planes, b)
    del x, y
    torch.cuda.empty_cache()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_module_dispatch_leading_dims_noncontiguous(dtype):
    layer = fe.FlashEQLinear(4 * 48, 4 * 59, device=DEV, dtype=dtype)
    x = torch.randn(3, 5, 4 * 48, 7, device=DEV, dtype=dtype).transpose(-1, -2)  # (3, 5, 7, 192), strided
    assert backend_for(x, 4) == "cuda"
    y = layer(x)
    assert y.shape == (3, 5, 7, 4 * 59)
    check_against_linear(
        y.reshape(-1, 4 * 59), x.reshape(-1, 4 * 48), layer.weight.detach(), layer.bias.detach()
    )
    assert layer(x[:, :0]).shape == (3, 0, 7, 4 * 59)


def test_equivariance_fp32():
    layer = fe.FlashEQLinear(4 * 200, 4 * 64, device=DEV)
    x = torch.randn(1000, 4 * 200, device=DEV)

    def rot(t):
        return torch.roll(t.unflatten(-1, (-1, 4)), 1, -1).flatten(-2)

    with torch.no_grad():
        assert rel_l2(layer(rot(x)), rot(layer(x))) < 1e-6


def test_matches_naive_layer_and_grads_fp32():
    naive = fe.NaiveEQLinear(4 * 59, 4 * 48, device=DEV, dtype=torch.float64)
    flash = fe.FlashEQLinear.from_naive(naive.weight.detach().float(), naive.bias.detach().float())
    x = torch.randn(129, 4 * 59, device=DEV, dtype=torch.float64, requires_grad=True)
    xf = x.detach().float().requires_grad_()
    y, yf = naive(x), flash(xf)
    assert rel_l2(yf, y) < 1e-5
    g = torch.randn_like(y)
    y.backward(g)
    yf.backward(g.float())
    assert rel_l2(xf.grad, x.grad) < 1e-5
    wgrad = fe.naive_to_planes(naive.weight.grad)  # planes are an orthogonal map of w
    assert rel_l2(flash.weight.grad, wgrad) < 1e-5
    assert rel_l2(flash.bias.grad, naive.bias.grad) < 1e-5
    # One SGD step of each: the flash layer's group-domain weight follows the naive layer's.
    before = naive.weight.detach().clone()
    for m in (naive, flash):
        torch.optim.SGD(m.parameters(), lr=0.5).step()
    assert (naive.weight.detach() - before).abs().max() > 1e-3  # the step moved the weights
    assert rel_l2(flash.naive_weight(), naive.weight) < 1e-5
    assert rel_l2(flash.bias, naive.bias) < 1e-5


@pytest.mark.parametrize("M, c, d", [(129, 48, 40), (33, 16, 24)])  # tiled and narrow forward kernels
def test_double_backward_matches_fp64(M, c, d):
    """create_graph=True (gradient penalties, Hessian-vector products): second derivatives through
    every gradient equal the float64 reference path's."""
    x, planes, b = make(M, c, d, torch.float32, seed=c + d)
    gy = torch.randn(M, 4 * d, device=DEV)

    def second_order(x, planes, b, fn):
        x, planes, b = (t.detach().requires_grad_() for t in (x, planes, b))
        gx, gp, gb = torch.autograd.grad(
            (fn(x, planes, b) * gy.to(x.dtype)).sum(), (x, planes, b), create_graph=True
        )
        penalty = gx.square().sum() + gp.square().sum() + gp.sum() * x.sum() + gx.sum() * b.sum()
        return torch.autograd.grad(penalty, (x, planes, b), allow_unused=True, materialize_grads=True)

    ours = second_order(x, planes, b, lambda x, p, b: fe.flash_eq_linear(x, p, b, 4))
    ref = second_order(
        x.double(), planes.double(), b.double(), lambda x, p, b: reference.fourier_eq_linear(x, p, b, 4)
    )
    for a, r, name in zip(ours, ref, ("x", "planes", "bias"), strict=True):
        assert a.dtype == torch.float32 and rel_l2(a, r) < 1e-5, name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    x, planes, b = make(37, 59, 16, dtype)
    op = torch.ops.flash_eqlinear.eq_linear_fwd.default
    torch.library.opcheck(op, (x, planes, b))
    torch.library.opcheck(op, (x, planes, None))
    # With every input requiring grad, the autograd registration is exercised too.
    grads = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
    torch.library.opcheck(op, tuple(grads))


@pytest.mark.parametrize("kind", ["fwd", "cast", "xf"])
def test_eager_function_matches_registered_op(kind):
    """Eager calls of flash_eq_linear run the ops through _registry.call (an autograd.Function below the
    autograd key, or no autograd at all where nothing needs a gradient); torch.compile and direct calls
    use the op's registered autograd kernel. Same outputs and gradients, bit for bit."""
    from flash_eqlinear import _registry

    x, planes, b = make(67, 48, 40, torch.bfloat16, seed=5)
    if kind == "cast":  # an FP32 x, rounded in the op, grad_x in FP32
        x = x.float() + torch.randn_like(x, dtype=torch.float32) * 1e-3
    gy = torch.randn(67, 160, device=DEV).to(torch.bfloat16)
    op = _registry.EAGER[kind][0]

    def run(fn):
        args = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
        out = fn(*args)
        y = out[0] if isinstance(out, tuple) else out
        y.backward(gy)
        return [y.detach()] + [a.grad for a in args]

    for got, want in zip(run(lambda *a: _registry.call(kind, *a)), run(op), strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    with torch.no_grad():  # below the autograd key
        y = _registry.call(kind, x, planes, b)
    assert torch.equal(y[0] if isinstance(y, tuple) else y, run(op)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_graph_training_step(dtype):
    """A training step captured in CUDA graphs (make_graphed_callables: what small batches use to shed the
    host cost per layer) gives the eager step's output and gradients, bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(fe.FlashEQLinear(192, 256), torch.nn.GELU(), fe.FlashEQLinear(256, 128))
    model = model.to(DEV, dtype)
    eager = copy.deepcopy(model)
    x = torch.randn(300, 192, device=DEV, dtype=dtype, requires_grad=True)
    gy = torch.randn(300, 128, device=DEV, dtype=dtype)
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    results = []
    for m in (graphed, eager):
        xi = x.detach().clone().requires_grad_()
        y = m(xi)
        y.backward(gy)
        results.append([y.detach(), xi.grad] + [p.grad for p in m.parameters()])
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)


def test_torch_compile_fullgraph():
    model = torch.nn.Sequential(fe.FlashEQLinear(256, 512), torch.nn.GELU(), fe.FlashEQLinear(512, 256)).to(
        DEV
    )
    x = torch.randn(4, 33, 256, device=DEV)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x)) or rel_l2(compiled(x), model(x)) < 1e-6


@pytest.mark.parametrize("M,c,d", [(300, 48, 40), (300, 192, 576)])  # mma.sync; Hopper kernels
def test_compiled_ops_take_any_layout(M, c, d):
    # The ops are tagged flexible_layout (Inductor may hand over its buffers' views as they are): compiled
    # calls on transposed views of pointwise results, with planes and a bias that are views too, equal
    # eager calls on contiguous copies bit for bit.
    ops = torch.ops.flash_eqlinear
    names = ["eq_linear_fwd", "eq_linear_bwd_weight", "eq_group_dft", "eq_linear_bwd", "eq_linear_fwd_xf"]
    for name in names + ["eq_linear_bwd_xf", "eq_linear_fwd_gelu", "eq_linear_fwd_cast"]:
        assert torch.Tag.flexible_layout in getattr(ops, name).default.tags, name
    x, planes, b = make(M, c, d, torch.bfloat16)
    gy = torch.randn(M, 4 * d, device=DEV).to(torch.bfloat16)
    bias = torch.stack([b, b], 1)[:, 0]  # stride 2

    def views(xt, gyt, p):
        y = ops.eq_linear_fwd((xt * 2).t(), p.transpose(1, 2).contiguous().transpose(1, 2), bias)
        return y, ops.eq_linear_bwd((gyt + 1).t(), (xt * 2).t(), p, True, True, True)

    got = torch.compile(views, fullgraph=True)(x.t().contiguous(), gy.t().contiguous(), planes)
    y = ops.eq_linear_fwd(x * 2, planes, b)
    want = (y, ops.eq_linear_bwd(gy + 1, x * 2, planes, True, True, True))
    assert all(torch.equal(g, w) for g, w in zip((got[0], *got[1]), (want[0], *want[1]), strict=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_export(dtype, tmp_path):
    # torch.export (deployment): the fused op is a node of the exported graph (its fake registration traces
    # it), the program with a dynamic batch matches eager bit for bit, and survives a save / load round trip.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        fe.FlashEQLinear(4 * 48, 4 * 64), torch.nn.GELU(), fe.FlashEQLinear(4 * 64, 4 * 40)
    )
    model = model.to(DEV, dtype).eval()
    x, x5 = (torch.randn(n, 37, 4 * 48, device=DEV, dtype=dtype) for n in (3, 5))
    ep = check_export(model, x, x5, tmp_path / "model.pt2")
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert sum("flash_eqlinear.eq_linear_fwd" in t for t in targets) == 2, targets


@pytest.mark.parametrize("mode", ["fused", "gemm"])
def test_torch_compile_training_step_matches_eager(mode, monkeypatch):
    debug_env(monkeypatch, weight_grad=mode)
    torch.manual_seed(0)
    layers = [fe.FlashEQLinear(256, 512), torch.nn.GELU(), fe.FlashEQLinear(512, 128)]
    eager = torch.nn.Sequential(*layers).to(DEV)
    compiled_model = copy.deepcopy(eager)
    x = torch.randn(64, 256, device=DEV)

    def step(model, opt):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, compiled_model)]
    compiled_step = torch.compile(step, fullgraph=False)
    for _ in range(3):
        le, lc = step(eager, opts[0]), compiled_step(compiled_model, opts[1])
        assert torch.allclose(le, lc, rtol=1e-5, atol=1e-6)
    for pe, pc in zip(eager.parameters(), compiled_model.parameters(), strict=True):
        assert rel_l2(pc, pe) < 1e-5
    # The model itself (forward + backward through the op) compiles as one graph.
    fwd = torch.compile(compiled_model, fullgraph=True, dynamic=True)
    xg = torch.randn(33, 256, device=DEV, requires_grad=True)
    fwd(xg).sum().backward()
    xe = xg.detach().clone().requires_grad_()
    compiled_model(xe).sum().backward()
    assert rel_l2(xg.grad, xe.grad) < 1e-5


def test_autocast_follows_linear():
    layer = fe.FlashEQLinear(256, 128, device=DEV)
    lin = torch.nn.Linear(256, 128, device=DEV)
    x = torch.randn(64, 256, device=DEV)
    for dt in (torch.float16, torch.bfloat16):
        with torch.autocast("cuda", dtype=dt):
            y, yl = layer(x), lin(x)
        assert y.dtype == yl.dtype == dt


def test_misuse_raises():
    x, planes, b = make(8, 16, 16, torch.float32)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    with pytest.raises(RuntimeError, match="features"):
        op(x[:, :-4], planes, b)
    with pytest.raises(RuntimeError, match="dtype"):
        op(x.half(), planes, b)
    with pytest.raises(RuntimeError, match="bias"):
        op(x, planes, b[:-1])
    with pytest.raises(RuntimeError, match="is on cpu"):
        fe.flash_eq_linear(x.cpu(), planes, b)
    with pytest.raises(ValueError, match="group size"):
        fe.flash_eq_linear(x, planes[:3], b, group_size=4)


def test_main_entry_point_on_gpu():
    import subprocess
    import sys

    args = [sys.executable, "-m", "flash_eqlinear", "--rows", "4096", "--channels", "512", "--iters", "3"]
    for dtype in ("fp32", "bf16"):
        res = subprocess.run([*args, "--dtype", dtype], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "path: the fused CUDA kernels" in res.stdout, res.stdout
        assert "verdict: checks passed" in res.stdout, res.stdout
