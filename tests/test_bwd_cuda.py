"""Backward of the fused p4 layer on CUDA: each gradient against float64, the grad-input and weight-gradient
forms (fused, GEMM, Hopper, TF32 / 3xTF32), the training forward that keeps x's planes, double backward.

Criterion as in test_fwd_cuda: within twice the error of F.linear's matching gradient in the same dtype.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    ROUNDOFF,
    check_against_linear,
    check_grads,
    debug_env,
    fp64_grads,
    fp64_reference,
    launched_kernels,
    linear_grads,
    make,
    rel_l2,
    require_cuda_kernels,
)

import flash_eqlinear as fe
from flash_eqlinear import reference

require_cuda_kernels()

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [1, 3, 16, 48, 59, 64, 200, 1025]


@pytest.mark.parametrize("mode", ["fused", "gemm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, d", [(257, 59, 48), (7, 3, 59), (129, 64, 64), (4097, 16, 200)])
@pytest.mark.parametrize("which", ["grad_x", "grad_planes", "grad_bias"])
def test_gradients_against_fp64(which, M, c, d, dtype, mode, monkeypatch):
    # grad_x runs the fused forward kernel on the adjoint planes, grad_planes / grad_bias the
    # weight-gradient method `mode`. Each gradient is compared with float64 autograd of the naive
    # layer, relative to the error of F.linear's matching gradient.
    debug_env(monkeypatch, weight_grad=mode)
    k = ["grad_x", "grad_planes", "grad_bias"].index(which)
    x, planes, b = make(M, c, d, dtype, seed=M + c + d)
    g = torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
    fe.flash_eq_linear(*leaves).backward(g)
    got, want = leaves[k].grad, fp64_grads(x, planes, b, g)[k]
    err = rel_l2(got, want)
    lin_err = rel_l2(linear_grads(x, planes, b, g, dtype)[k], linear_grads(x, planes, b, g, torch.float64)[k])
    tol = 1e-5 if dtype == torch.float32 else 2 * max(lin_err, ROUNDOFF[dtype] / 8)
    assert got.dtype == dtype and err <= tol, (err, tol)


@pytest.mark.parametrize("form", ["fused", "gemm", "auto"])
@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "M, c, d", [(257, 59, 48), (7, 3, 59), (4097, 64, 200), (1000, 512, 512), (300, 520, 1026)]
)
def test_fwd_products_forms(M, c, d, dtype, sm90, form, monkeypatch):
    # fp16 / bf16 forward by the fused kernels or by the GEMM form (group DFT, cuBLAS GEMMs with FP32
    # products, inverse DFT + bias): forced by FLASH_EQLINEAR_DEBUG=products=..., or by default for layers
    # with c * d >= 2^18 where the Hopper kernel does not run. Within 2x F.linear's error against float64;
    # the profiler shows which form ran.
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1" if sm90 else "0")
    debug_env(monkeypatch, narrow="0", products=None if form == "auto" else form)
    x, planes, b = make(M, c, d, dtype, seed=M + c + d)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    names = launched_kernels(lambda: op(x, planes, b))
    hopper = sm90 and torch.cuda.get_device_capability()[0] == 9 and c % 8 == 0 and d % 2 == 0
    want_gemm = form == "gemm" or (form == "auto" and c * d >= 2**18 and not hopper)
    assert any("group_idft" in n for n in names) == want_gemm, names
    y = op(x, planes, b)
    check_against_linear(y, x, planes, b)
    assert torch.equal(op(x, planes, b), y)  # deterministic
    x = (x.float() / x.float().abs().max() * 3e4).to(dtype)  # fp16: the halved transform stays finite
    check_against_linear(op(x, planes, None), x, planes, None)


@pytest.mark.parametrize("form", ["fused", "gemm"])
@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M, c, d", [(257, 59, 48), (7, 3, 59), (4097, 64, 200), (1000, 256, 512), (0, 8, 8)])
def test_grad_x_forms(M, c, d, dtype, sm90, form, monkeypatch):
    # With the GEMM-form weight gradient, fp16 / bf16 grad_x comes from a fused kernel (the Hopper one
    # where it runs) or from grad_y's Fourier planes through cuBLAS GEMMs with FP32 products and the
    # inverse-DFT pass (FLASH_EQLINEAR_DEBUG=products=gemm; by default wherever the Hopper kernel does
    # not run, and for the largest layers). All three gradients within 2x F.linear's error against
    # float64; the profiler shows which grad_x ran.
    debug_env(monkeypatch, weight_grad="gemm")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1" if sm90 else "0")
    debug_env(monkeypatch, products=form)
    x, planes, b = make(M, c, d, dtype, seed=M + c + d)
    g = torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]

    def backward():
        for t in leaves:
            t.grad = None
        fe.flash_eq_linear(*leaves).backward(g)

    names = launched_kernels(backward)
    if M > 0:
        assert any("group_idft" in n for n in names) == (form == "gemm"), names
    check_grads([t.grad for t in leaves], x, planes, b, g, dtype, ROUNDOFF[dtype] / 8)


def gemm_form_chunks(M, row_bytes, mb):
    """Row chunks of a GEMM-form pass with row_bytes of workspace per row under a cap of mb MB: chunks
    of a multiple of 128 rows, at least 1024 (as eq_linear_host.cpp's gemm_form_chunk_rows)."""
    rows = max(1024, (mb << 20) // row_bytes // 128 * 128)
    return -(-M // rows)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, d", [(3000, 512, 512), (2000, 264, 1000)])
def test_gemm_forms_in_row_chunks(M, c, d, dtype, allow_tf32, monkeypatch):
    # The GEMM forms' passes over rows (the inference forward; grad_x from grad_y's planes) run in
    # chunks whose workspace stays under FLASH_EQLINEAR_DEBUG=workspace_mb=... where 1024 rows fit in it
    # (8 MB: the 1024-row minimum; 20 MB: 1280-2560-row chunks; 16-bit with the GEMM form forced, FP32 with
    # TF32). The chunk counts as computed; forward and all three gradients within 2x F.linear's error
    # (TF32: or 2^-11) against float64, as unchunked; a bad setting raises.
    debug_env(monkeypatch, weight_grad="gemm")
    debug_env(monkeypatch, products="gemm")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0")  # TF32: the GEMM form, not the fused kernel
    x, planes, b = make(M, c, d, dtype, seed=M + c)
    g = torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    floor = 2.0**-11 if dtype == torch.float32 else ROUNDOFF[dtype] / 8
    ref, w = fp64_reference(x, planes, b)
    lin = F.linear(x, reference.dense_weight(w).to(dtype), b.repeat_interleave(4))
    for mb in (8, 20, 100000):
        debug_env(monkeypatch, workspace_mb=mb)
        names = launched_kernels(lambda: op(x, planes, b))
        want = gemm_form_chunks(M, 4 * (c * x.element_size() + 4 * d), mb)
        assert sum("group_idft" in n for n in names) == want, (mb, want, names)
        leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
        y = fe.flash_eq_linear(*leaves)
        names = launched_kernels(lambda y=y: y.backward(g))
        if dtype != torch.float32:  # grad_x from grad_y's planes: 4 c FP32 products per row
            assert sum("group_idft" in n for n in names) == gemm_form_chunks(M, 16 * c, mb), (mb, names)
        assert rel_l2(y, ref) <= 2 * max(rel_l2(lin, ref), floor), (rel_l2(y, ref), rel_l2(lin, ref))
        check_grads([t.grad for t in leaves], x, planes, b, g, dtype, floor)
    debug_env(monkeypatch, workspace_mb="lots")
    with pytest.raises(RuntimeError, match="workspace_mb"):
        op(x, planes, b)


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "dft-cublas"])
@pytest.mark.parametrize("mode", ["fused", "gemm"])
@pytest.mark.parametrize(
    "M, c, d", [(257, 59, 48), (7, 3, 1), (4097, 64, 200), (300, 1025, 16), (1000, 36, 50), (20000, 64, 130)]
)
def test_tf32_path(M, c, d, mode, sm90, allow_tf32, monkeypatch):
    # FP32 with TF32 allowed (PyTorch's switch, which F.linear follows too): the forward and grad_x on
    # tensor cores (the fused Hopper kernel where it applies: c % 4 == 0, d even; else group DFT +
    # cuBLAS TF32 GEMMs + inverse DFT), the weight gradient by `mode`. Each output within 2x of
    # F.linear's own TF32 error, or of TF32's unit roundoff 2^-11.
    debug_env(monkeypatch, weight_grad=mode)
    if not sm90:
        monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0")
    debug_env(monkeypatch, narrow="0")  # the narrow kernel is exact FP32, not TF32
    x, planes, b = make(M, c, d, torch.float32, seed=M + c)
    g = torch.randn(M, 4 * d, device=DEV)
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
    y = fe.flash_eq_linear(*leaves)
    y.backward(g)
    x64, p64, b64 = [t.detach().double().requires_grad_() for t in (x, planes, b)]
    y64 = reference.naive_eq_linear(x64, fe.planes_to_naive(p64), b64, 4)
    y64.backward(g.double())
    W64 = reference.dense_weight(fe.planes_to_naive(planes.double())).requires_grad_()
    B64 = b.double().repeat_interleave(4).requires_grad_()
    W, B = W64.detach().float().requires_grad_(), B64.detach().float().requires_grad_()
    xl, xl64 = x.detach().clone().requires_grad_(), x.double().requires_grad_()
    yl, yl64 = F.linear(xl, W, B), F.linear(xl64, W64, B64)
    yl.backward(g)
    yl64.backward(g.double())
    assert rel_l2(y, y64) > 1e-6  # TF32 rounding is visible: the tensor-core path ran
    pairs = [
        (y, y64, yl, yl64),
        (leaves[0].grad, x64.grad, xl.grad, xl64.grad),
        (leaves[1].grad, p64.grad, W.grad, W64.grad),
        (leaves[2].grad, b64.grad, B.grad, B64.grad),
    ]
    for i, (got, want, lin, lin64) in enumerate(pairs):
        err, tol = rel_l2(got, want), 2 * max(rel_l2(lin, lin64), 2.0**-11)
        assert got.dtype == torch.float32 and err <= tol, (i, err, tol)


@pytest.mark.parametrize(
    "dtype, sm90, M, c, d",
    [
        (torch.float32, True, 300, 1024, 1030),
        (torch.float32, False, 129, 1025, 1026),
        (torch.float16, False, 64, 2048, 2050),
        (torch.bfloat16, False, 33, 2050, 2048),
        (torch.float32, True, 3000, 2048, 2048),  # three row chunks
        (torch.float16, False, 3000, 2048, 2048),
    ],
    ids=str,
)
def test_three_product_gemm_form(dtype, sm90, M, c, d, allow_tf32, monkeypatch):
    # The inference forward's GEMM form takes the complex pair as three products from c d >= 2^20 (FP32
    # with TF32 allowed) / 2^22 (fp16 / bf16): k1 = (s/4) PR, k2 = (fR/2) (PI - PR)/2, k3 = (fI/2) (PR +
    # PI)/2, s = fR + fI; the training forward, which keeps x's four planes, takes four. Both within 2x
    # of F.linear's error (TF32: or of 2^-11) on random data and where aR cancels (fR = fI, PI ~ PR),
    # fp16 inputs near its range stay finite (random ones, and fR = fI = 2 max |x| that puts s/4 at
    # max |x|), and the two forms differ: the three-product one ran. The cancelling aR alone (y0
    # without bias, P0 and P2) within 3x of the four-product form's error. The inference form runs in
    # row chunks (FLASH_EQLINEAR_DEBUG=workspace_mb=64: the last two shapes take the 1024-row minimum,
    # three chunks of 1024, 1024 and 952 rows).
    debug_env(monkeypatch, workspace_mb="64")
    if not sm90:
        monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0")
    x, planes, b = make(M, c, d, dtype, seed=c + d)
    xq = x.float().view(M, c, 4).clone()
    xq[..., 3] = xq[..., 0] - xq[..., 2] + xq[..., 1]  # fI = fR
    adversarial = planes.clone()
    adversarial[2] = adversarial[1] * (1 + 1e-3 * torch.randn_like(adversarial[1]))  # PI ~ PR
    cases = [(x, planes), (xq.view(M, 4 * c).to(dtype), adversarial)]
    if dtype != torch.float32:
        cases.append(((x.float() / x.float().abs().max() * 3e4).to(dtype), planes))
        sign = torch.randint(0, 2, (M, c, 1), device=DEV).float() * 2 - 1
        edge = sign * torch.tensor([6e4, -6e4, -6e4, 6e4], device=DEV)  # fR = fI = 1.2e5, s/4 = 6e4
        cases.append((edge.view(M, 4 * c).to(dtype), (planes.float() / 64).to(dtype)))
    for xx, pp in cases:
        y = torch.ops.flash_eqlinear.eq_linear_fwd(xx, pp, b)
        y4 = torch.ops.flash_eqlinear.eq_linear_fwd_xf(xx, pp, b)[0]
        assert not torch.equal(y, y4)
        for got in (y, y4):
            if dtype != torch.float32:
                check_against_linear(got, xx, pp, b)
                continue
            ref, w = fp64_reference(xx, pp, b)
            lin = F.linear(xx, reference.dense_weight(w).float(), b.repeat_interleave(4))
            tol = 2 * max(rel_l2(lin, ref), 2.0**-11)
            assert rel_l2(got, ref) <= tol, (rel_l2(got, ref), tol)
    xx, pp = cases[1][0], adversarial.clone()
    pp[0] = pp[3] = 0
    ref = fp64_reference(xx, pp, None)[0].view(M, d, 4)[..., 0]
    y = torch.ops.flash_eqlinear.eq_linear_fwd(xx, pp, None).view(M, d, 4)[..., 0]
    y4 = torch.ops.flash_eqlinear.eq_linear_fwd_xf(xx, pp, None)[0].view(M, d, 4)[..., 0]
    assert rel_l2(y, ref) <= 3 * rel_l2(y4, ref) + 1e-8, (rel_l2(y, ref), rel_l2(y4, ref))


@pytest.mark.parametrize("M, c, d", [(300, 512, 512), (129, 1025, 260), (2049, 256, 1024)])
def test_split_tf32_mode(M, c, d, monkeypatch):
    # FLASH_EQLINEAR_FP32=3xtf32: layers with c * d >= 2^18 run hi/lo-split TF32 GEMMs, the hi*hi
    # product in short K chunks summed in FP32 (the tensor cores' own accumulation error grows with K).
    # The contract: within 2x of the exact FP32 kernel's error. The result is repeatable, PyTorch's
    # TF32 setting is left as it was, and smaller layers keep the exact kernel.
    op = torch.ops.flash_eqlinear.eq_linear_fwd
    x, planes, b = make(M, c, d, torch.float32, seed=M + c + d)
    xs, ps, bs = make(64, 16, 16, torch.float32)
    exact, exact_small = op(x, planes, b), op(xs, ps, bs)
    monkeypatch.setenv("FLASH_EQLINEAR_FP32", "3xtf32")
    y = op(x, planes, b)
    ref, _ = fp64_reference(x, planes, b)
    err, err_exact = rel_l2(y, ref), rel_l2(exact, ref)
    assert not torch.equal(y, exact)  # the split path ran
    assert err <= 2 * err_exact, (err, err_exact)
    assert torch.equal(op(x, planes, b), y)
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.equal(op(xs, ps, bs), exact_small)


def weight_grad_of_linear(x, gy, dtype):
    """F.linear's grad weight / grad bias for x, gy cast to dtype (the criterion's yardstick)."""
    W = torch.zeros(gy.shape[1], x.shape[1], device=DEV, dtype=dtype, requires_grad=True)
    B = torch.zeros(gy.shape[1], device=DEV, dtype=dtype, requires_grad=True)
    F.linear(x.to(dtype), W, B).backward(gy.to(dtype))
    return W.grad, B.grad


def emulated_weight_grad(x, gy, dtype):
    """The low-precision kernels' algorithm in float64: group transforms rounded once to dtype,
    exact sums, the result rounded once. (4, d, c)."""

    def transform(t):
        t0, t1, t2, t3 = t.double().reshape(t.shape[0], -1, 4).unbind(-1)
        return [v.to(dtype).double() for v in (t0 + t1 + t2 + t3, t0 - t2, t3 - t1, t0 - t1 + t2 - t3)]

    f0, fr, fi, f2 = transform(x)
    g0, gr, gi, g2 = transform(gy)
    h = 0.5**0.5
    planes = [g0.T @ f0 / 2, (gr.T @ fr + gi.T @ fi) * h, (gi.T @ fr - gr.T @ fi) * h, g2.T @ f2 / 2]
    return torch.stack(planes).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [0, 1, 7, 129, 4097])
@pytest.mark.parametrize(
    "c, d", [(1, 1), (3, 59), (59, 3), (16, 48), (48, 200), (64, 64), (200, 1025), (1025, 16)]
)  # noqa: E501
def test_fused_weight_grad(M, c, d, dtype):
    check_fused_weight_grad(M, c, d, dtype)


def check_fused_weight_grad(M, c, d, dtype):
    """The weight-gradient kernels against the float64 closed-form reduction. FP32: under 1e-5.
    fp16 / bf16: the kernel is the algorithm (agrees with its float64 emulation to rounding), and
    its error is within twice F.linear's on the same inputs. The transforms are rounded once, so
    the expected ratio is ~1.8 (sqrt(3.2): two operand roundings besides the output's); on grads
    of fewer than 1024 elements the ratio of two errors is too noisy to test (measured on 200
    seeds for (c, d) = (1, 1): median 1.7, max 7), so there only the emulation check applies.
    grad_bias: within twice the larger of F.linear's error and one rounding of the exact value."""
    x, planes, _ = make(M, c, d, dtype, seed=M + 31 * c + d)
    gy = torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy)
    _, rp, rb = reference.fourier_eq_linear_backward(gy.double(), x.double(), planes.double())
    assert gp.shape == (4, d, c) and gb.shape == (d,) and gp.dtype == gb.dtype == dtype
    if M == 0:
        assert torch.equal(gp, torch.zeros_like(gp)) and torch.equal(gb, torch.zeros_like(gb))
        return
    if dtype == torch.float32:
        assert rel_l2(gp, rp) < 1e-5 and rel_l2(gb, rb) < 1e-5
    else:
        assert rel_l2(gp, emulated_weight_grad(x, gy, dtype)) <= ROUNDOFF[dtype]
        lw, lb = weight_grad_of_linear(x, gy, dtype)
        lw64, lb64 = weight_grad_of_linear(x, gy, torch.float64)
        if gp.numel() >= 1024:
            assert rel_l2(gp, rp) <= 2 * rel_l2(lw, lw64), (rel_l2(gp, rp), rel_l2(lw, lw64))
        tol_b = 2 * max(rel_l2(lb, lb64), rel_l2(rb.to(dtype), rb))
        assert rel_l2(gb, rb) <= tol_b, (rel_l2(gb, rb), tol_b)
    again = torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy)
    assert torch.equal(again[0], gp) and torch.equal(again[1], gb)  # deterministic


HOPPER_WEIGHT_GRAD_MODES = [(192, 768, "fused"), (256, 1024, "fused"), (1024, 256, "fused")]
HOPPER_WEIGHT_GRAD_MODES += [(512, 512, "gemm"), (2048, 256, "gemm")]


@pytest.mark.parametrize("c, d, mode", HOPPER_WEIGHT_GRAD_MODES)
def test_weight_grad_mode_on_hopper(c, d, mode, monkeypatch):
    # fp16 / bf16 on Hopper: the fused (Hopper) weight gradient below c·d = 2^18, and at 2^18 for narrow
    # layers (min(c, d) <= 256: ViT-L's fc layers); the GEMM form from there.
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper dispatch only")
    from flash_eqlinear import ops

    debug_env(monkeypatch, weight_grad="auto")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1")
    for dtype in (torch.float16, torch.bfloat16):
        assert ops.plan(0, c, d, dtype, DEV, needs_p=True)["weight_grad"] == mode


# Shapes of the Hopper weight-gradient kernel (c, d even): ragged tiles (c % 64, d % 128), c < 64, several
# row chunks (and bias tiles spread over the c tiles), M off the 32-row k tile, last o tiles of 64 channels
# (warpgroup 2 idle) beside full ones, the ViT-B qkv and fc2 layers.
SM90_WEIGHT_GRAD_SHAPES = [(1, 2, 2), (33, 16, 48), (4097, 48, 200), (3001, 130, 258), (700, 200, 1026)]
SM90_WEIGHT_GRAD_SHAPES += [(9000, 66, 16), (40, 130, 258), (3000, 64, 192)]
SM90_WEIGHT_GRAD_SHAPES += [(25216, 192, 576), (25216, 768, 192)]


@pytest.mark.parametrize("path", ["sm90", "sm90-swapped", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M, c, d", SM90_WEIGHT_GRAD_SHAPES)
def test_fused_weight_grad_each_path(M, c, d, dtype, path, monkeypatch):
    # FLASH_EQLINEAR_SM90=0 forces the mma.sync kernel where the Hopper one would run, and
    # FLASH_EQLINEAR_DEBUG=wgrad_swap=... the Hopper kernel's operand roles (x as the A operand: the
    # template's second argument); all meet check_fused_weight_grad's criteria, and the profiler's kernel
    # names say which one ran.
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0" if path == "portable" else "1")
    debug_env(monkeypatch, wgrad_swap="1" if path == "sm90-swapped" else "0")
    check_fused_weight_grad(M, c, d, dtype)
    x, gy = torch.randn(M, 4 * c, device=DEV, dtype=dtype), torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    names = launched_kernels(lambda: torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy))
    hopper = path != "portable" and torch.cuda.get_device_capability()[0] == 9
    swapped = f", {str(path == 'sm90-swapped').lower()}>"
    assert any("eq_bwd_weight_sm90_kernel" in n and swapped in n for n in names) == hopper, names
    assert any("eq_linear_bwd_weight_mma_kernel" in n for n in names) != hopper, names


@pytest.mark.parametrize("r", ["0.5", "1"])
@pytest.mark.parametrize("M, c, d", [(25216, 192, 576), (25216, 192, 192), (20000, 64, 258)])
def test_weight_grad_last_tile_split(M, c, d, r, monkeypatch):
    """Where the Hopper kernel's last o tile is at most 64 channels wide it may take fewer, longer row chunks
    than the other tiles (split_last_tile; FLASH_EQLINEAR_DEBUG=wgrad_half_r=... is the time ratio it assumes:
    at 0.5 the H100 plans of these shapes split it, at 1 they stay uniform): correct and deterministic either
    way, in the weight-gradient op and in the whole backward (fused weight gradient forced; its reduce kernel
    also makes grad_x's planes)."""
    debug_env(monkeypatch, wgrad_half_r=r)
    check_fused_weight_grad(M, c, d, torch.bfloat16)
    x, planes, _ = make(M, c, d, torch.bfloat16, seed=5)
    gy = torch.randn(M, 4 * d, device=DEV, dtype=torch.bfloat16)
    debug_env(monkeypatch, weight_grad="fused")
    gx, gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd(gy, x, planes, True, True, True)
    want = torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy)
    assert torch.equal(gp, want[0]) and torch.equal(gb, want[1])
    assert torch.equal(gx, torch.ops.flash_eqlinear.eq_linear_fwd(gy, reference.adjoint_planes(planes), None))


ROLE_CASES = [(768, 192, True), (128, 64, True), (192, 576, False), (192, 768, False), (256, 256, False)]


@pytest.mark.parametrize("c, d, swapped", ROLE_CASES)
def test_weight_grad_roles_by_default(c, d, swapped, monkeypatch):
    """The Hopper weight gradient swaps its operand roles where that pads the output to fewer tile cells
    (ViT-B's fc2: d = 192, c = 768), and only there."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel runs on compute capability 9.x")
    debug_env(monkeypatch, wgrad_swap=None)
    x = torch.randn(256, 4 * c, device=DEV, dtype=torch.bfloat16)
    gy = torch.randn(256, 4 * d, device=DEV, dtype=torch.bfloat16)
    names = launched_kernels(lambda: torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy))
    want = f"eq_bwd_weight_sm90_kernel<__nv_bfloat16, {str(swapped).lower()}>"
    assert any(want in n for n in names), names


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fused_weight_grad_fp16_range_and_alignment(dtype):
    # |x| up to 3e4 (fp16: the transform is halved so it cannot overflow) and inputs at an offset
    # that is not 16-byte aligned (the binding copies them).
    M, c, d = 300, 48, 40
    x = (torch.rand(M, 4 * c + 1, device=DEV) * 6e4 - 3e4).to(dtype)[:, 1:]
    gy = (torch.randn(M, 4 * d + 1, device=DEV) * 1e-2).to(dtype)[:, 1:]  # keeps grad_planes in range
    gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd_weight(x, gy)
    zeros = torch.zeros(4, d, c, dtype=torch.float64, device=DEV)
    _, rp, rb = reference.fourier_eq_linear_backward(gy.double(), x.double(), zeros)
    assert torch.isfinite(gp).all() and torch.isfinite(gb).all()
    assert rel_l2(gp, rp) < 4 * ROUNDOFF[dtype] and rel_l2(gb, rb) < 4 * ROUNDOFF[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, n", [(0, 3), (1, 1), (129, 59), (33, 6), (4097, 64), (3001, 300), (20000, 2)])
@pytest.mark.parametrize("input", [True, False])
def test_group_dft_planes(M, n, input, dtype):
    # The Fourier planes of the GEMM weight gradient: float64 transform rounded once; the column
    # sums of x0+x1+x2+x3 (grad_bias for grad_y) in FP32, bitwise repeatable.
    t = torch.randn(M, 4 * n, device=DEV, dtype=dtype)
    out, sums = torch.ops.flash_eqlinear.eq_group_dft(t, input, True)
    t0, t1, t2, t3 = t.double().reshape(M, n, 4).unbind(-1)
    f0, f2, fr, fi = t0 + t1 + t2 + t3, t0 - t1 + t2 - t3, t0 - t2, t3 - t1
    h = 0.5**0.5
    want = [f0 / 2, f2 / 2, fr * h, fi * h] if input else [f0, f2, fr, fi]
    want = torch.stack(want)
    assert out.shape == want.shape and out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else ROUNDOFF[dtype]
    assert M == 0 or rel_l2(out, want) <= tol
    assert sums.shape == (n,) and sums.dtype == torch.float32
    want_sums = f0.sum(0)
    assert (sums.double() - want_sums).abs().max() <= 1e-5 * (f0.abs().sum(0).max() + 1)
    out2, sums2 = torch.ops.flash_eqlinear.eq_group_dft(t, input, True)
    assert torch.equal(out, out2) and torch.equal(sums, sums2)
    plain, none = torch.ops.flash_eqlinear.eq_group_dft(t, input, False)
    assert torch.equal(plain, out) and none.numel() == 0
    if M:
        torch.library.opcheck(torch.ops.flash_eqlinear.eq_group_dft.default, (t, input, True))
        # A view 4 elements (8 bytes for 16-bit types) off a 16-byte boundary: narrower loads, same bits.
        t_off = torch.empty(M * 4 * n + 4, device=DEV, dtype=dtype)[4:].view(M, 4 * n).copy_(t)
        assert torch.equal(torch.ops.flash_eqlinear.eq_group_dft(t_off, input, False)[0], out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gemm", [False, True])
@pytest.mark.parametrize("needs", [(1, 1, 1), (1, 0, 0), (0, 1, 0), (0, 0, 1)])
@pytest.mark.parametrize("M, c, d", [(301, 24, 40), (7, 1, 5), (7, 3, 1)])
def test_backward_op(M, c, d, dtype, gemm, needs, monkeypatch):
    # The one-call backward: each requested gradient against float64, empty (0,) tensors otherwise;
    # the planes are left as they were (c = 1 or d = 1: the adjoint must be a copy, not a view).
    debug_env(monkeypatch, weight_grad="gemm" if gemm else "fused")
    x, planes, _ = make(M, c, d, dtype)
    gy = torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    needs = tuple(map(bool, needs))
    args = (gy, x, planes, *needs)
    want = reference.fourier_eq_linear_backward(gy.double(), x.double(), planes.double())
    before = planes.clone()
    got = torch.ops.flash_eqlinear.eq_linear_bwd(*args)
    assert torch.equal(planes, before)
    tol = 1e-5 if dtype == torch.float32 else 4 * ROUNDOFF[dtype]
    for need, g, w in zip(needs, got, want, strict=True):
        assert (g.shape == w.shape and rel_l2(g, w) < tol) if need else g.numel() == 0
    torch.library.opcheck(torch.ops.flash_eqlinear.eq_linear_bwd.default, args)
    with pytest.raises(RuntimeError, match="eq_linear_bwd"):
        torch.ops.flash_eqlinear.eq_linear_bwd(gy[:, :-4], x, planes, *needs)


def test_fused_weight_grad_in_autograd():
    naive = fe.NaiveEQLinear(4 * 59, 4 * 48, device=DEV, dtype=torch.float64)
    flash = fe.FlashEQLinear.from_naive(naive.weight.detach().float(), naive.bias.detach().float())
    x = torch.randn(3000, 4 * 59, device=DEV, dtype=torch.float64)
    g = torch.randn(3000, 4 * 48, device=DEV, dtype=torch.float64)
    naive(x).backward(g)
    flash(x.float()).backward(g.float())
    assert rel_l2(flash.weight.grad, fe.naive_to_planes(naive.weight.grad)) < 1e-5
    assert rel_l2(flash.bias.grad, naive.bias.grad) < 1e-5
    for dt in DTYPES:
        op = torch.ops.flash_eqlinear.eq_linear_bwd_weight.default
        torch.library.opcheck(op, (x[:37].to(dt), g[:37].to(dt)))


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "M, c, d, rule",
    [(300, 512, 520, "auto"), (33, 2048, 2048, "auto"), (257, 59, 48, "gemm"), (0, 40, 8, "gemm")]
    + [(600, 64, 40, "auto")]  # grad_bias from grad_y's written planes: 3 row chunks, ragged columns
    + [(2000, 512, 520, "auto")]  # more Hopper tiles (144) than SMs: blocks write planes for several tiles
    + [(4500, 256, 64, "auto")],  # grad_x's kernel: 144 tiles, so blocks write f0 sums for several tiles
)
def test_training_forward_keeps_planes(M, c, d, rule, dtype, sm90, monkeypatch):
    # fp16 / bf16 training forwards with the GEMM-form weight gradient keep x's Fourier planes instead
    # of x (written by the Hopper kernel, or made by the GEMM form: by default where the Hopper kernel
    # does not run from c * d >= 2^18, on Hopper from 2^22; always with FLASH_EQLINEAR_DEBUG=products=gemm),
    # and the backward makes no group DFT of x (on Hopper none of grad_y either: grad_x's kernel writes
    # its planes). The output and all three gradients within 2x F.linear's error against float64.
    debug_env(monkeypatch, weight_grad="gemm")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1" if sm90 else "0")
    debug_env(monkeypatch, products=None if rule == "auto" else rule)
    hopper = sm90 and torch.cuda.get_device_capability()[0] == 9
    keeps = rule == "gemm" or hopper or c * d >= 2**18
    x, planes, b = make(M, c, d, dtype, seed=M + c + d)
    g = torch.randn(M, 4 * d, device=DEV, dtype=dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
    y = fe.flash_eq_linear(*leaves)
    if M > 0:
        check_against_linear(y.detach(), x, planes, b)
    names = launched_kernels(lambda: y.backward(g))
    if M > 0:
        assert any("group_dft_kernel" in n and ", true>" in n for n in names) != keeps, names
        hopper_gx = hopper and rule == "auto" and c * d < 2**22  # grad_x's kernel writes grad_y's planes
        assert any("group_dft_kernel" in n for n in names) != hopper_gx, names
    check_grads([t.grad for t in leaves], x, planes, b, g, dtype, ROUNDOFF[dtype] / 8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_kept_planes_ops(dtype, monkeypatch):
    # eq_linear_fwd_xf / eq_linear_bwd_xf: opcheck (fake, autograd registration), the planes' layout
    # ([f0 | f2 | fR | fI] / 2 column blocks), and clear errors.
    from flash_eqlinear._registry import x_from_halved_planes

    x, planes, b = make(37, 40, 16, dtype)
    gy = torch.randn(37, 4 * 16, device=DEV, dtype=dtype)
    fwd, bwd = torch.ops.flash_eqlinear.eq_linear_fwd_xf, torch.ops.flash_eqlinear.eq_linear_bwd_xf
    y, xf = fwd(x, planes, b)  # on Hopper: written by the Hopper kernel (c = 40: a ragged k tile)
    assert rel_l2(x_from_halved_planes(xf), x) < 2 * ROUNDOFF[dtype]
    gdft = torch.ops.flash_eqlinear.eq_group_dft(x, False, False)[0]  # [f0, f2, fR, fI] (4, M, c)
    assert torch.equal(xf.view(37, 4, 40).transpose(0, 1), 0.5 * gdft)
    if torch.cuda.get_device_capability()[0] == 9:  # the Hopper kernel's output, as eq_linear_fwd's
        assert torch.equal(y, torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, b))
    torch.library.opcheck(fwd.default, (x, planes, b))
    torch.library.opcheck(fwd.default, tuple(t.detach().clone().requires_grad_() for t in (x, planes, b)))
    torch.library.opcheck(bwd.default, (gy, xf, planes, True, True, True))
    want = reference.fourier_eq_linear_backward(gy.double(), x.double(), planes.double())
    for got, w in zip(bwd(gy, xf, planes, True, True, True), want, strict=True):
        assert rel_l2(got, w) < 4 * ROUNDOFF[dtype]
    with pytest.raises(RuntimeError, match="dtype"):
        fwd(x, planes.float(), b)
    with pytest.raises(RuntimeError, match="eq_linear_bwd_xf: want grad_y"):
        bwd(gy[:, :-4], xf, planes, True, True, True)
    with pytest.raises(RuntimeError, match="features"):
        fwd(x[:, :-4], planes, b)


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "portable"])
@pytest.mark.parametrize("M, c, d", [(300, 520, 260), (100, 1024, 512)])
def test_tf32_training_forward_keeps_planes(M, c, d, sm90, allow_tf32, monkeypatch):
    # FP32 with TF32 allowed: training forwards that take the DFT + cuBLAS form (c * d >= 2^19 on
    # Hopper, else from 2^17) keep x's planes too; each gradient within 2x of F.linear's TF32 error.
    if not sm90:
        monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0")
    keeps = not (sm90 and torch.cuda.get_device_capability()[0] == 9) or c * d >= 2**19
    x, planes, b = make(M, c, d, torch.float32, seed=M + c)
    g = torch.randn(M, 4 * d, device=DEV)
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
    y = fe.flash_eq_linear(*leaves)
    names = launched_kernels(lambda: y.backward(g))
    assert any("group_dft_kernel" in n and ", true>" in n for n in names) != keeps, names
    check_grads([t.grad for t in leaves], x, planes, b, g, torch.float32, 2.0**-11)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_kept_planes_double_backward(dtype, monkeypatch):
    # create_graph=True through the planes-keeping forward: x is rebuilt from its planes by stock ops
    # and second derivatives reach x through the planes' own gradient. Against float64, no worse than
    # twice the x-saving path's error.
    debug_env(monkeypatch, weight_grad="gemm")
    debug_env(monkeypatch, products="gemm")
    x, planes, b = make(129, 48, 40, dtype, seed=5)
    gy = torch.randn(129, 4 * 40, device=DEV)

    def second_order(x, planes, b, fn):
        x, planes, b = (t.detach().requires_grad_() for t in (x, planes, b))
        gx, gp, gb = torch.autograd.grad(
            (fn(x, planes, b) * gy.to(x.dtype)).sum(), (x, planes, b), create_graph=True
        )
        penalty = gx.float().square().sum() + gp.float().square().sum()
        penalty = penalty + gp.float().sum() * x.float().sum() + gx.float().sum() * b.float().sum()
        return torch.autograd.grad(penalty, (x, planes, b), allow_unused=True, materialize_grads=True)

    flash = lambda x, p, b: fe.flash_eq_linear(x, p, b, 4)  # noqa: E731
    kept = second_order(x, planes, b, flash)
    debug_env(monkeypatch, keep_planes="0")
    saved = second_order(x, planes, b, flash)
    ref = second_order(
        x.double(), planes.double(), b.double(), lambda x, p, b: reference.fourier_eq_linear(x, p, b, 4)
    )
    for a, s, r, name in zip(kept, saved, ref, ("x", "planes", "bias"), strict=True):
        assert a.dtype == dtype and rel_l2(a, r) <= 2 * max(rel_l2(s, r), ROUNDOFF[dtype]), name


def test_kept_planes_compiled_training_step(monkeypatch):
    # torch.compile of a bf16 training step through the planes-keeping forward matches eager.
    debug_env(monkeypatch, weight_grad="gemm")
    debug_env(monkeypatch, products="gemm")
    torch.manual_seed(0)
    layers = [fe.FlashEQLinear(256, 512), torch.nn.GELU(), fe.FlashEQLinear(512, 128)]
    eager = torch.nn.Sequential(*layers).to(DEV, torch.bfloat16)
    compiled_model = copy.deepcopy(eager)
    x = torch.randn(64, 256, device=DEV, dtype=torch.bfloat16)

    def step(model, opt):
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled_model)]
    compiled_step = torch.compile(step, fullgraph=False)
    names = launched_kernels(lambda: step(eager, opts[0]))
    assert not any("group_dft_kernel" in n and ", true>" in n for n in names)  # x's planes were kept
    compiled_step(compiled_model, opts[1])
    for _ in range(2):
        le, lc = step(eager, opts[0]), compiled_step(compiled_model, opts[1])
        assert torch.allclose(le, lc, rtol=1e-2)
    for pe, pc in zip(eager.parameters(), compiled_model.parameters(), strict=True):
        assert rel_l2(pc, pe) < 1e-2
