"""Small, varied kernel launches for compute-sanitizer (memcheck, racecheck): ragged and aligned
shapes in every dtype, with and without bias. Exits non-zero on a wrong result."""

import sys

import torch
from common import debug_switch, env_switch

import flash_eqlinear  # noqa: F401  (registers the ops)
from flash_eqlinear import reference

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
SHAPES = [(1, 1, 1), (7, 3, 59), (129, 59, 200), (300, 64, 64), (257, 200, 48), (64, 1025, 16)]
SHAPES += [(17925, 16, 16)]  # more tiles than SMs: persistent blocks walk several
SHAPES += [(257, 20, 31), (1000, 32, 32), (4097, 16, 8)]  # the narrow kernel's other tiles
SHAPES += [(5000, 40, 200), (20000, 3, 200)]  # FP32 tiled: more tiles than blocks (one k tile for c = 3)
# Which ops: fwd, bwd, dft (group DFT), tiles (FP32 tiles), gemm (the 16-bit GEMM forms), gauss (the
# three-product GEMM form), wgrad (the 16-bit weight gradient on shapes of its Hopper kernel), mlp (the
# Hopper kernel's GELU epilogue), cast (an FP32 x under autocast: eq_linear_fwd_cast and the FP32 grad_x
# of the Hopper kernel), wgrad-normal / wgrad-swapped (one operand role of wgrad's), hopper (the Hopper
# forward alone, its clusters forced; not in the default list), split3 (a layer's output in three parts),
# norm (the group LayerNorm, forward and backward, each fields-per-lane variant and dtype pair);
# "quick": the weight-gradient sets without their largest shapes (racecheck runs each launch ~100x
# slower).
DIRECTIONS = sys.argv[1:] or [
    "fwd",
    "bwd",
    "dft",
    "tiles",
    "gemm",
    "gauss",
    "wgrad",
    "mlp",
    "cast",
    "split3",
    "norm",
]
BWD_SHAPES = SHAPES + [(5000, 48, 59), (3000, 64, 128)]
if "quick" in DIRECTIONS:
    BWD_SHAPES = [s for s in BWD_SHAPES if s[0] <= 5000]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def layer(M, c, d, dtype=torch.float32, bias=True):
    """A layer's input x (M, 4c), planes (4, d, c) scaled to unit-variance outputs and bias (d,) or None."""
    x = torch.randn(M, 4 * c, device="cuda", dtype=dtype)
    planes = (torch.randn(4, d, c, device="cuda") / (4 * c) ** 0.5).to(dtype)
    b = torch.randn(d, device="cuda", dtype=dtype) if bias else None
    return x, planes, b


def fp64_forward(x, planes, b):
    """The reference forward in float64."""
    return reference.fourier_eq_linear(x.double(), planes.double(), None if b is None else b.double(), 4)


for dtype in (torch.float32, torch.float16, torch.bfloat16) if "fwd" in DIRECTIONS else ():
    for M, c, d in SHAPES:
        for bias in (True, False):
            x, planes, b = layer(M, c, d, dtype, bias)
            y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
            err = rel_err(y, fp64_forward(x, planes, b))
            assert err < TOL[dtype], (dtype, M, c, d, err)
# FP32 with TF32 allowed: group DFT, cuBLAS GEMMs, inverse DFT + bias.
torch.backends.cuda.matmul.allow_tf32 = "fwd" in DIRECTIONS
for M, c, d in SHAPES if "fwd" in DIRECTIONS else ():
    x, planes, b = layer(M, c, d)
    err = rel_err(torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b), fp64_forward(x, planes, b))
    assert err < 5e-3, ("tf32", M, c, d, err)
torch.backends.cuda.matmul.allow_tf32 = False
# Exact FP32 narrow tiles for c or d in 33 .. 64 (taken when forced), vector and element paths.
for M, c, d in [(1000, 64, 64), (257, 48, 59), (4097, 33, 64), (129, 64, 20)] if "fwd" in DIRECTIONS else ():
    x = torch.randn(M * 4 * c + 1, device="cuda")[1:].view(M, 4 * c)  # 4-byte offset: the element path
    for xi in (x.clone(), x):
        planes = torch.randn(4, d, c, device="cuda") / (4 * c) ** 0.5
        b = torch.randn(d, device="cuda")
        ref = fp64_forward(xi, planes, b)
        with debug_switch("narrow", "1"):
            y = torch.ops.flash_eqlinear.eq_linear_fwd(xi, planes, b)
        assert rel_err(y, ref) < 1e-5, ("narrow fp32", M, c, d)
# Each exact-FP32 tile forced, more tiles than blocks in flight and a single k tile (c = 3).
for tile in ("big", "small", "small4") if "tiles" in DIRECTIONS else ():
    for M, c, d in [(5000, 40, 200), (3001, 3, 48), (129, 64, 64), (7, 200, 33)]:
        x, planes, b = layer(M, c, d)
        ref = fp64_forward(x, planes, b)
        with debug_switch("narrow", "0"), debug_switch("fp32_tile", tile):
            y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
        assert rel_err(y, ref) < 1e-5, ("tile", tile, M, c, d)


def check_weight_grad(dtype, M, c, d, what, group_dft=False):
    """grad_planes and grad_bias of random x and grad_y against float64, alone and in the whole backward
    with the fused weight gradient (whose launches also make grad_x's adjoint planes; grad_x checked too);
    with group_dft, also both group DFTs (grad_bias from grad_y's column sums checked too)."""
    x, planes, _ = layer(M, c, d, dtype, bias=False)
    gy = torch.randn(M, 4 * d, device="cuda", dtype=dtype)
    gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy)
    with debug_switch("weight_grad", "fused"):
        gx, gp2, gb2 = torch.ops.flash_eqlinear.eq_linear_bwd(gy, x, planes, True, True, True)
    needs = (False, True, True)
    _, rp, rb = reference.fourier_eq_linear_backward(gy.double(), x.double(), planes.double(), needs)
    rx = fp64_forward(gy, reference.adjoint_planes(planes), None)
    checks = [(gp, rp), (gb, rb), (gp2, rp), (gb2, rb), (gx, rx)]
    if group_dft:
        torch.ops.flash_eqlinear.eq_group_dft(x, True, False)
        checks.append((torch.ops.flash_eqlinear.eq_group_dft(gy, False, True)[1], rb))
    for got, ref in checks:
        err = rel_err(got, ref)
        assert err < TOL[dtype], (what, dtype, M, c, d, err)


# Weight gradient (grad_planes, grad_bias): ragged shapes, including a larger M (split over M).
for dtype in (torch.float32, torch.float16, torch.bfloat16) if "bwd" in DIRECTIONS else ():
    for M, c, d in BWD_SHAPES:
        check_weight_grad(dtype, M, c, d, "bwd_weight", group_dft=True)
# The 16-bit weight gradient where its Hopper kernel runs (c, d even): ragged tiles, c < 64, several row
# chunks, M off the 32-row k tile, last o tiles of 64 channels beside full ones.
WGRAD_SHAPES = [(1, 2, 2), (33, 16, 48), (4097, 48, 200), (3001, 130, 258), (700, 200, 1026), (9000, 66, 16)]
WGRAD_SHAPES += [(40, 130, 258), (3000, 64, 192)]
# A half-wide last o tile with fewer, longer row chunks than the others (split_last_tile; H100 plans), not in
# "quick".
WGRAD_SHAPES += [(25216, 192, 576), (25216, 192, 192)]
if "quick" in DIRECTIONS:
    WGRAD_SHAPES = [s for s in WGRAD_SHAPES if s[0] <= 10000]
# The Hopper kernel's operand roles (FLASH_EQLINEAR_DEBUG=wgrad_swap=0|1): "wgrad" runs both,
# "wgrad-normal" or "wgrad-swapped" one (racecheck of both takes more than 280 s).
for role, swap in (("normal", "0"), ("swapped", "1")):
    if "wgrad" not in DIRECTIONS and f"wgrad-{role}" not in DIRECTIONS:
        continue
    with debug_switch("wgrad_swap", swap):
        for dtype in (torch.float16, torch.bfloat16):
            for M, c, d in WGRAD_SHAPES:
                check_weight_grad(dtype, M, c, d, f"wgrad {role}")
# The GEMM forms with fp16 / bf16 plane products (FLASH_EQLINEAR_DEBUG=products=gemm): the forward (halved
# group DFT, inverse DFT + bias into 16-bit) and the whole backward with grad_x from grad_y's planes;
# pairs and single channels; the planes-keeping training forward and its backward.
# (6000, 64, 136): more Hopper tiles (141) than SMs, so blocks write planes for a second tile.
GEMM_SHAPES = [
    (7, 3, 59),
    (129, 59, 200),
    (1000, 64, 48),
    (257, 200, 31),
    (300, 40, 136),
    (600, 64, 40),
    (6000, 64, 136),
]
for dtype in (torch.float16, torch.bfloat16) if "gemm" in DIRECTIONS else ():
    for M, c, d in GEMM_SHAPES:
        x, planes, b = layer(M, c, d, dtype)
        gy = torch.randn(M, 4 * d, device="cuda", dtype=dtype)
        with (
            debug_switch("products", "gemm"),
            debug_switch("narrow", "0"),
            debug_switch("workspace_mb", "1"),  # row chunks of 1024 (6000 rows: six)
            debug_switch("weight_grad", "gemm"),
        ):
            y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
            gx, gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd(gy, x, planes, True, True, True)
        yref = fp64_forward(x, planes, b)
        assert rel_err(y, yref) < TOL[dtype], ("fwd gemm", dtype, M, c, d)
        want = reference.fourier_eq_linear_backward(gy.double(), x.double(), planes.double())
        for got, ref in zip((gx, gp, gb), want, strict=True):
            assert rel_err(got, ref) < TOL[dtype], ("bwd gemm", dtype, M, c, d)
        # The training forward that keeps x's planes (on Hopper, for c % 8 == 0 and even d, written by
        # the Hopper kernel), and its backward from them (grad_y's planes from grad_x's Hopper kernel).
        yk, xf = torch.ops.flash_eqlinear.eq_linear_fwd_xf(x, planes, b)
        assert rel_err(yk, yref) < TOL[dtype], ("fwd_xf", dtype, M, c, d)
        kept = torch.ops.flash_eqlinear.eq_linear_bwd_xf(gy, xf, planes, True, True, True)
        for got, ref in zip(kept, want, strict=True):
            assert rel_err(got, ref) < TOL[dtype], ("bwd_xf", dtype, M, c, d)
# The Hopper forward alone, small enough for racecheck: plain (also in clusters of two) and planes-writing
# variants (fp16 / bf16) and TF32, ragged c and d, and 141 tiles in the last shape (blocks walk several,
# stages wrap across tiles).
HOPPER_SHAPES = [(300, 64, 64), (129, 40, 66), (1100, 96, 136), (6000, 64, 136)]
torch.backends.cuda.matmul.allow_tf32 = "hopper" in DIRECTIONS
for dtype in (torch.float16, torch.bfloat16, torch.float32) if "hopper" in DIRECTIONS else ():
    for M, c, d in HOPPER_SHAPES:
        x, planes, b = layer(M, c, d, dtype)
        yref = fp64_forward(x, planes, b)
        tol = 5e-3 if dtype == torch.float32 else TOL[dtype]
        y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
        assert rel_err(y, yref) < tol, ("hopper", dtype, M, c, d)
        with debug_switch("sm90_cluster", "2"):  # clusters of two sharing x
            y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
        assert rel_err(y, yref) < tol, ("hopper clusters", dtype, M, c, d)
        if dtype != torch.float32:
            yk, _ = torch.ops.flash_eqlinear.eq_linear_fwd_xf(x, planes, b)
            assert rel_err(yk, yref) < tol, ("hopper xf", dtype, M, c, d)
torch.backends.cuda.matmul.allow_tf32 = False
# The inference forward's GEMM form with the complex pair as three products (from c d >= 2^20 with TF32,
# 2^22 in fp16 / bf16): its five-block group DFT, strided GEMMs and three-product inverse DFT; ragged c, d;
# row chunks.
GAUSS_CASES = [
    (torch.float32, [(65, 1031, 1031), (3, 1024, 1030), (3000, 2048, 2048)]),  # the last: three row chunks
    (torch.float16, [(65, 2051, 2047)]),
    (torch.bfloat16, [(130, 2048, 2048)]),
]
for dtype, shapes in GAUSS_CASES if "gauss" in DIRECTIONS else ():
    torch.backends.cuda.matmul.allow_tf32 = dtype == torch.float32
    for M, c, d in shapes:
        x, planes, b = layer(M, c, d, dtype)
        with debug_switch("products", "gemm"), debug_switch("workspace_mb", "64"):
            y = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b)
        tol = 5e-3 if dtype == torch.float32 else TOL[dtype]
        assert rel_err(y, fp64_forward(x, planes, b)) < tol, ("gauss", dtype, M, c, d)
torch.backends.cuda.matmul.allow_tf32 = False
# GELU in the fused kernels' epilogue (fp16 / bf16: Hopper, clusters of two at h = 512, and mma.sync; TF32),
# ragged M and h.
for dtype in (torch.float16, torch.bfloat16) if "mlp" in DIRECTIONS else ():
    for M, c, h in [(129, 48, 136), (1000, 48, 512), (257, 64, 66), (257, 59, 66)]:
        x, w1, b1 = layer(M, c, h, dtype)
        want = torch.nn.functional.gelu(fp64_forward(x, w1, b1))
        for sm90 in ("1", "0"):
            with env_switch("FLASH_EQLINEAR_SM90", sm90):
                a = torch.ops.flash_eqlinear.eq_linear_fwd_gelu(x, w1, b1)
            assert rel_err(a, want) < TOL[dtype], ("gelu", dtype, M, c, h, sm90)
torch.backends.cuda.matmul.allow_tf32 = "mlp" in DIRECTIONS  # the TF32 kernel's GELU epilogue
for M, c, h in [(129, 48, 136), (257, 64, 66)] if "mlp" in DIRECTIONS else ():
    x, w1, b1 = layer(M, c, h)
    a = torch.ops.flash_eqlinear.eq_linear_fwd_gelu(x, w1, b1)
    assert rel_err(a, torch.nn.functional.gelu(fp64_forward(x, w1, b1))) < 5e-3, ("gelu tf32", M, c, h)
torch.backends.cuda.matmul.allow_tf32 = False
# An FP32 x under autocast: eq_linear_fwd_cast, and grad_x in FP32 (the Hopper kernel's FP32 epilogue;
# clusters of two at c = 512; c = 59 and FLASH_EQLINEAR_SM90=0: the mma.sync kernel's; the fused weight
# gradient's plan, whose grad_x is the kernel's).
for dtype in (torch.float16, torch.bfloat16) if "cast" in DIRECTIONS else ():
    for M, c, d in [(1000, 192, 576), (300, 512, 64), (129, 48, 40), (257, 59, 48)]:
        x, planes, b = layer(M, c, d)
        p, bl = planes.to(dtype), b.to(dtype)
        y, xl = torch.ops.flash_eqlinear.eq_linear_fwd_cast(x, p, bl)
        assert rel_err(y, fp64_forward(xl, p, bl)) < TOL[dtype], ("cast", dtype, M, c, d)
        gy = torch.randn(M, 4 * d, device="cuda", dtype=dtype)
        want = fp64_forward(gy, reference.adjoint_planes(p), None)
        for sm90 in ("1", "0"):
            with env_switch("FLASH_EQLINEAR_SM90", sm90), debug_switch("weight_grad", "fused"):
                gx, _, _ = torch.ops.flash_eqlinear.eq_linear_bwd(gy, xl, p, True, False, False, True)
            assert gx.dtype == torch.float32 and rel_err(gx, want) < TOL[dtype], ("cast gx", M, c, d, sm90)
# A layer's output in three parts (eq_linear_fwd_split3) and the backward from three part gradients: the
# Hopper forward writing the parts (clusters of two at d = 768), grad_x reading them (three x maps), the
# weight gradient reading them as either operand (FLASH_EQLINEAR_DEBUG=wgrad_swap); d / 3 = 48: joined or
# copied where a part is not whole tiles; an FP32 x (the cast and its FP32 grad_x).
SPLIT_SHAPES = [(1000, 192, 576), (300, 256, 768), (129, 48, 144), (700, 64, 192)]
if "quick" in DIRECTIONS:
    SPLIT_SHAPES = [(min(M, 100), c, d) for M, c, d in SPLIT_SHAPES]
fwd3, bwd3 = torch.ops.flash_eqlinear.eq_linear_fwd_split3, torch.ops.flash_eqlinear.eq_linear_bwd_split3
for dtype in (torch.float16, torch.bfloat16) if "split3" in DIRECTIONS else ():
    for M, c, d in SPLIT_SHAPES:
        x, planes, b = layer(M, c, d, dtype)
        y = torch.cat(fwd3(x, planes, b)[:3], 1)
        assert rel_err(y, fp64_forward(x, planes, b)) < TOL[dtype], ("split3", dtype, M, c, d)
        gy = torch.randn(M, 4 * d, device="cuda", dtype=dtype)
        want = reference.fourier_eq_linear_backward(gy.double(), x.double(), planes.double())
        for swap in ("0", "1"):
            with debug_switch("wgrad_swap", swap):
                got = bwd3(*gy.chunk(3, 1), x, planes, True, True, True)
            for g, r in zip(got, want, strict=True):
                assert rel_err(g, r) < TOL[dtype], ("bwd split3", dtype, M, c, d, swap)
        xl = fwd3(x.float(), planes, b)[3]
        gx = bwd3(*gy.chunk(3, 1), xl, planes, True, False, False, True)[0]
        assert gx.dtype == torch.float32 and rel_err(gx, want[0]) < TOL[dtype], ("split3 cast", M, c, d)
# Group DFT alone (its shared-memory column-sum reduction; each channels-per-thread width).
for dtype in (torch.float32, torch.float16, torch.bfloat16) if "dft" in DIRECTIONS else ():
    for M, n in [(1, 1), (129, 59), (33, 6), (4097, 64), (3001, 300), (20000, 2), (5000, 48)]:
        t = torch.randn(M, 4 * n, device="cuda", dtype=dtype)
        want = t.double().view(M, n, 4).sum((0, 2))
        for input in (True, False):
            _, sums = torch.ops.flash_eqlinear.eq_group_dft(t, input, True)
            assert rel_err(sums, want) < TOL[dtype], ("group_dft", dtype, M, n, input)
# The group LayerNorm: each fields-per-lane width (c <= 32, 64, ..., 512), ragged rows, each dtype pair,
# grad_x with and without the parameters' partial sums.
ln_fwd, ln_bwd = torch.ops.flash_eqlinear.group_layer_norm_fwd, torch.ops.flash_eqlinear.group_layer_norm_bwd
LN_PAIRS = [(torch.float32, torch.float32), (torch.float32, torch.bfloat16), (torch.float16, torch.float16)]
LN_PAIRS += [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)]
for xt, yt in LN_PAIRS if "norm" in DIRECTIONS else ():
    for M, c in [
        (1, 1),
        (37, 33),
        (129, 64),
        (70, 100),
        (300, 192),
        (33, 256),
        (17, 320),
        (5, 512),
        (3000, 24),
    ]:
        x = torch.randn(M, 4 * c, device="cuda").to(xt)
        w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
        y, mean, rstd = ln_fwd(x, w, b, 1e-5, yt)
        x64 = x.double().requires_grad_()
        ref = torch.nn.functional.layer_norm(
            x64, (4 * c,), w.double().repeat_interleave(4), b.double().repeat_interleave(4)
        )
        assert rel_err(y, ref) < TOL[yt], ("norm", xt, yt, M, c)
        gy = torch.randn(M, 4 * c, device="cuda").to(yt)
        (gx_want,) = torch.autograd.grad(ref, x64, gy.double())
        for needs_wb in (True, False):
            gx = ln_bwd(gy, x, w, mean, rstd, True, needs_wb)[0]
            assert rel_err(gx, gx_want) < 4 * TOL[xt], ("norm bwd", xt, yt, M, c, needs_wb)
torch.cuda.synchronize()
print("sanitize cases OK")
