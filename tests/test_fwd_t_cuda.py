"""The forward for group sizes 2 and 8 on CUDA (``flash_eqlinear::eq_linear_fwd_t``, the GEMM form) and the
decision that routes a layer's inference calls to it (``ops.gemm_form_t``).

Criterion as for p4 (tests/test_fwd_cuda.py): the relative L2 error against the float64 naive layer at most
twice that of F.linear with the dense weight in the same dtype (floored at u/8); FP32 under 1e-5.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import debug_env, rel_l2, require_cuda_kernels, roll_group

import flash_eqlinear as fe
from flash_eqlinear import ops, reference

require_cuda_kernels()

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
OP = torch.ops.flash_eqlinear.eq_linear_fwd_t.default


def make_t(M, c, d, T, dtype, x_scale=1.0, bias=True, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(M, T * c, device=DEV, generator=g) * x_scale).to(dtype)
    planes = (torch.randn(T, d, c, device=DEV, generator=g) / (T * c) ** 0.5).to(dtype)
    b = torch.randn(d, device=DEV, generator=g).to(dtype) if bias else None
    return x, planes, b


def check_t(y, x, planes, b):
    T = planes.shape[0]
    assert y.dtype == x.dtype and y.shape == (x.shape[0], T * planes.shape[1]) and torch.isfinite(y).all()
    w = fe.planes_to_naive(planes.double())
    ref = reference.naive_eq_linear(x.double(), w, None if b is None else b.double(), T)
    if x.shape[0] == 0:
        return
    err = rel_l2(y, ref)
    if x.dtype == torch.float32:
        assert err < 1e-5, err
        return
    B = None if b is None else b.repeat_interleave(T)
    lin_err = rel_l2(F.linear(x, reference.dense_weight(w).to(x.dtype), B), ref)
    assert err <= 2 * max(lin_err, ROUNDOFF[x.dtype] / 8), (err, lin_err)


SHAPES = [(1, 1, 1), (7, 3, 5), (129, 48, 40), (300, 128, 96), (0, 4, 4), (2050, 17, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T", [2, 8])
@pytest.mark.parametrize("M, c, d", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_fwd_t_matches_fp64(M, c, d, T, dtype, bias):
    x, planes, b = make_t(M, c, d, T, dtype, bias=bias, seed=M * 7919 + c * 31 + d + T)
    check_t(OP(x, planes, b), x, planes, b)


@pytest.mark.parametrize("T", [2, 8])
def test_fwd_t_is_equivariant_and_non_contiguous(T):
    x, planes, b = make_t(64, 24, 16, T, torch.float32)
    y = OP(x, planes, b)
    assert rel_l2(OP(roll_group(x, T), planes, b), roll_group(y, T)) < 1e-6
    xt = torch.empty(T * 24, 64, device=DEV).t().copy_(x)  # a transposed view
    assert torch.equal(OP(xt, planes, b), y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fwd_t_keeps_linears_range(dtype):
    """Large 16-bit inputs: finite wherever F.linear with the dense weight is (the transform's values stay
    within the input's range)."""
    x, planes, b = make_t(256, 64, 64, 8, dtype, x_scale=1e4 if dtype == torch.float16 else 1e37)
    W = reference.dense_weight(fe.planes_to_naive(planes.double())).to(dtype)
    assert torch.isfinite(F.linear(x, W, b.repeat_interleave(8))).all()
    check_t(OP(x, planes, b), x, planes, b)


def test_fwd_t_opcheck_and_errors():
    x, planes, b = make_t(33, 8, 8, 8, torch.float32)
    torch.library.opcheck(OP, (x, planes, b))
    torch.library.opcheck(OP, (x, planes, None))
    with pytest.raises(ValueError, match=r"group size T = 2 or 8"):
        OP(x[:, :32], planes[:4], b)
    with pytest.raises(ValueError, match=r"x must be 2-D \(M, T\*c\)"):
        OP(x[:, 1:], planes, b)
    with pytest.raises(RuntimeError, match="does not match x dtype"):
        OP(x, planes.half(), b)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        OP(x, planes, b[:3])


def ops_called(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("flash_eqlinear::")]


@pytest.mark.parametrize("T", [2, 8])
@pytest.mark.parametrize("kind", ["flash", "swapped"])
def test_layers_run_it_in_inference_only(T, kind):
    """FlashEQLinear (planes kept in eval) and a swapped naive layer of group size 2 or 8: inference calls
    run the GEMM form where it is the faster one (same function), training calls the dense form."""
    torch.manual_seed(0)
    c = d = math.isqrt(max(ops._GEMM_FORM_T_MIN_CD[(T, kind)] for kind in ("fp32", "fast")))  # every dtype's
    naive = fe.NaiveEQLinear(T * c, T * d, group_size=T, device=DEV)
    if kind == "flash":
        layer = fe.FlashEQLinear.from_naive(naive.weight.detach(), naive.bias.detach())
    else:
        layer = fe.SwappedEQLinear(naive)
    x = torch.randn(2, 33, T * c, device=DEV)
    want = naive(x)
    layer.eval()
    for autocast in (False, True):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            assert fe.explain(layer, x)["form"] == "gemm_t"
            assert "flash_eqlinear::eq_linear_fwd_t" in ops_called(lambda: layer(x))
            y = layer(x)
        assert y.dtype == (torch.bfloat16 if autocast else torch.float32)
        assert rel_l2(y, want) < (1e-2 if autocast else 1e-5)
    layer.train()
    y = layer(x)
    assert "flash_eqlinear::eq_linear_fwd_t" not in ops_called(lambda: layer(x))
    y.sum().backward()
    assert rel_l2(y, want) < 1e-5


# ---- The backward (eq_linear_bwd_t) and training on the GEMM form (FLASH_EQLINEAR_DEBUG=gemm_t_train=1) ----

BWD = torch.ops.flash_eqlinear.eq_linear_bwd_t.default


def grads_t(x, planes, b, g, dtype):
    """(grad_x, grad_planes, grad_bias) of the naive layer in float64, and each one's error scale: the
    relative error of F.linear's matching gradient (dense weight) in dtype against float64."""
    T = planes.shape[0]
    x64, p64, b64 = (t.detach().double().requires_grad_() for t in (x, planes, b))
    y64 = reference.naive_eq_linear(x64, fe.planes_to_naive(p64), b64, T)
    want = torch.autograd.grad(y64, (x64, p64, b64), g.double())
    scales = []
    for dt in (dtype, torch.float64):
        W = reference.dense_weight(fe.planes_to_naive(planes.double())).to(dt).requires_grad_()
        B = b.to(dt).repeat_interleave(T).detach().requires_grad_()
        xl = x.to(dt).detach().requires_grad_()
        scales.append(torch.autograd.grad(F.linear(xl, W, B), (xl, W, B), g.to(dt)))
    return want, [rel_l2(a, e) for a, e in zip(*scales, strict=True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T", [2, 8])
@pytest.mark.parametrize("M, c, d", [(7, 3, 5), (300, 64, 48), (1029, 17, 40), (0, 4, 4)])
def test_bwd_t_matches_fp64(M, c, d, T, dtype):
    x, planes, b = make_t(M, c, d, T, dtype, seed=M + 31 * c + d + T)
    g = torch.randn(M, T * d, device=DEV).to(dtype)
    got = BWD(g, x, planes, True, True, True)
    if M == 0:
        assert [t.shape for t in got] == [x.shape, planes.shape, b.shape] and not any(
            t.abs().sum() for t in got
        )
        return
    want, lin = grads_t(x, planes, b, g, dtype)
    for k, (a, e) in enumerate(zip(got, want, strict=True)):
        tol = 1e-5 if dtype == torch.float32 else 2 * max(lin[k], ROUNDOFF[dtype] / 8)
        assert a.dtype == dtype and a.shape == e.shape and rel_l2(a, e) <= tol, (k, rel_l2(a, e), tol)
    only_p = BWD(g, x, planes, False, True, False)
    assert only_p[0].numel() == 0 and only_p[2].numel() == 0 and torch.equal(only_p[1], got[1])


def test_bwd_t_opcheck_and_differentiable_grads():
    x, planes, b = make_t(33, 8, 8, 8, torch.float32)
    args = (x.requires_grad_(), planes.requires_grad_(), b.requires_grad_())
    torch.library.opcheck(OP, args)  # (with the registered autograd)
    g = torch.randn(33, 64, device=DEV)
    torch.library.opcheck(BWD, (g, x.detach(), planes.detach(), True, True, True))
    # create_graph=True: a gradient penalty's second backward
    y = OP(*args)
    (gx,) = torch.autograd.grad(y, args[0], g, create_graph=True)
    (gpp,) = torch.autograd.grad(gx.square().sum(), args[1])
    p64 = planes.detach().double().requires_grad_()
    x64 = x.detach().double()
    (gx64,) = torch.autograd.grad(
        reference.naive_eq_linear(x64.requires_grad_(), fe.planes_to_naive(p64), None, 8),
        x64,
        g.double(),
        create_graph=True,
    )
    (want,) = torch.autograd.grad(gx64.square().sum(), p64)
    assert rel_l2(gpp, want) < 1e-5


@pytest.mark.parametrize("T", [2, 8])
@pytest.mark.parametrize("autocast", [False, True])
def test_layer_trains_on_it_with_the_switch(T, autocast, monkeypatch):
    """With gemm_t_train=1 a FlashEQLinear of group size 2 or 8 trains through eq_linear_fwd_t / _bwd_t (at
    any size): the naive layer's gradients."""
    debug_env(monkeypatch, gemm_t_train=1)
    torch.manual_seed(0)
    c = d = math.isqrt(max(ops._GEMM_FORM_T_MIN_CD[(T, kind)] for kind in ("fp32", "fast")))
    naive = fe.NaiveEQLinear(T * c, T * d, group_size=T, device=DEV)
    layer = fe.FlashEQLinear.from_naive(naive.weight.detach(), naive.bias.detach())
    x = torch.randn(3, 11, T * c, device=DEV, requires_grad=True)
    g = torch.randn(3, 11, T * d, device=DEV)
    results = []
    for mod, params in ((naive, (naive.weight, naive.bias)), (layer, (layer.weight, layer.bias))):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            if mod is layer:
                assert fe.explain(layer, x)["form"] == "gemm_t"
                assert "flash_eqlinear::eq_linear_fwd_t" in ops_called(lambda: layer(x))  # noqa: B023
            y = mod(x)
        gx, gw, gb = torch.autograd.grad(y, (x, *params), g.to(y.dtype))
        if mod is layer:
            gw = fe.planes_to_naive(gw)  # the planes' gradient, in the group domain (orthogonal map)
        results.append((y.float(), gx, gw, gb))
    tol = 2e-2 if autocast else 1e-5
    for a, e in zip(results[1], results[0], strict=True):
        assert a.shape == e.shape and rel_l2(a, e) < tol, rel_l2(a, e)


def test_compiled_inference_takes_it():
    """torch.compile of a C8 layer in inference traces the GEMM form's op (its fake): the eager output."""
    torch.manual_seed(0)
    c = d = math.isqrt(ops._GEMM_FORM_T_MIN_CD[(8, "fast")])
    layer = fe.FlashEQLinear(8 * c, 8 * d, group_size=8, device=DEV).eval()
    x = torch.randn(4, 9, 8 * c, device=DEV)
    with torch.no_grad():
        want = layer(x)
        got = torch.compile(layer)(x)
    assert rel_l2(got, want) < 1e-6
