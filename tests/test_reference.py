"""The pure-PyTorch paths: naive (dense expansion) and Fourier, their gradients and conventions."""

import math

import pytest
import torch
import torch.nn as nn
from conftest import GROUP_SIZES, ROUNDOFF, loop_eq_linear, rel_l2, roll_group

import flash_eqlinear as fe
from flash_eqlinear.reference import fourier_eq_linear, fourier_eq_linear_backward, naive_eq_linear

F64 = torch.float64
SIZES = [(1, 1), (3, 7), (7, 3), (16, 1), (1, 16), (3, 3)]  # (c, d), d != c included


def _problem(T, c, d, gen, n=5, dtype=F64, bias=True):
    x = torch.randn(n, c * T, generator=gen, dtype=F64).to(dtype)
    w = torch.randn(d, c, T, generator=gen, dtype=F64)
    b = torch.randn(d, generator=gen, dtype=F64) if bias else None
    return x, w, b


# ---------------------------------------------------------------------------------------------
# Forward values
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("c, d", SIZES)
@pytest.mark.parametrize("bias", [True, False])
def test_fourier_matches_naive_float64(T, c, d, bias, gen):
    x, w, b = _problem(T, c, d, gen, bias=bias)
    y_naive = naive_eq_linear(x, w, b, T)
    y_fourier = fourier_eq_linear(x, fe.naive_to_planes(w), b, T)
    assert y_naive.shape == y_fourier.shape == (5, d * T)
    assert rel_l2(y_fourier, y_naive) < 1e-13


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("c, d", [(1, 1), (3, 7), (7, 3), (2, 2)])
def test_both_match_loop_definition(T, c, d, gen):
    """Y[n,o,t] = sum_{ci,s} X[n,ci,s] w[o,ci,(s-t) mod T] + b[o], written as plain loops."""
    x, w, b = _problem(T, c, d, gen, n=3)
    expect = loop_eq_linear(x, w, b)
    assert rel_l2(naive_eq_linear(x, w, b, T), expect) < 1e-13
    assert rel_l2(fourier_eq_linear(x, fe.naive_to_planes(w), b, T), expect) < 1e-13


@pytest.mark.parametrize("T", [3, 4, 8])
def test_bias_is_shared_per_copy(T, gen):
    """Zero weight: every group copy of output channel o equals b[o] (catches a repeat vs tile bug)."""
    d, c = 3, 2
    x = torch.randn(4, c * T, generator=gen, dtype=F64)
    b = torch.tensor([1.0, -2.0, 5.0], dtype=F64)
    expect = b.repeat_interleave(T).expand(4, d * T)
    torch.testing.assert_close(naive_eq_linear(x, torch.zeros(d, c, T, dtype=F64), b, T), expect)
    torch.testing.assert_close(fourier_eq_linear(x, torch.zeros(T, d, c, dtype=F64), b, T), expect)


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("c, d", [(3, 7), (16, 16)])
def test_float32_close_to_float64(T, c, d, gen):
    x, w, b = _problem(T, c, d, gen, n=9)
    y64 = naive_eq_linear(x, w, b, T)
    planes32 = fe.naive_to_planes(w).float()
    y32 = fourier_eq_linear(x.float(), planes32, b.float(), T)
    assert y32.dtype == torch.float32
    assert rel_l2(y32, y64) < 1e-5
    assert rel_l2(naive_eq_linear(x.float(), w.float(), b.float(), T), y64) < 1e-5


def test_naive_accepts_reference_style_shapes(gen):
    x, w, b = _problem(4, 3, 2, gen)
    expect = naive_eq_linear(x, w, b, 4)
    torch.testing.assert_close(naive_eq_linear(x, w.unsqueeze(1), b[:, None], 4), expect, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Equivariance
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("shift", [1, 2, -1])
def test_equivariance(T, shift, gen):
    c, d = 3, 5
    x, w, b = _problem(T, c, d, gen, n=6)
    planes = fe.naive_to_planes(w)
    for f, weight in ((naive_eq_linear, w), (fourier_eq_linear, planes)):
        lhs = f(roll_group(x, T, shift), weight, b, T)
        rhs = roll_group(f(x, weight, b, T), T, shift)
        assert rel_l2(lhs, rhs) < 1e-13, f.__name__


@pytest.mark.parametrize("T", [2, 3, 4, 8])
def test_dense_linear_is_not_equivariant(T, gen):
    """The equivariance check can fail: a generic dense layer breaks it by O(1)."""
    lin = nn.Linear(3 * T, 5 * T, dtype=F64)
    x = torch.randn(6, 3 * T, generator=gen, dtype=F64)
    with torch.no_grad():
        err = rel_l2(lin(roll_group(x, T)), roll_group(lin(x), T))
    assert err > 0.1


@pytest.mark.parametrize("T", [2, 4, 6])
def test_roll_direction_matters(T, gen):
    """The layer is not symmetric under reversing the group axis (so the loop test pins the direction)."""
    x, w, b = _problem(T, 2, 3, gen)
    flipped = naive_eq_linear(x, w.flip(-1), b, T)
    assert rel_l2(flipped, naive_eq_linear(x, w, b, T)) > 0.1


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 8])
def test_gradcheck_fourier(T, gen):
    c, d = 2, 3
    x = torch.randn(3, c * T, generator=gen, dtype=F64, requires_grad=True)
    planes = torch.randn(T, d, c, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(d, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, p, b: fourier_eq_linear(x, p, b, T), (x, planes, b))


@pytest.mark.parametrize("T", [1, 4, 6])
def test_gradcheck_naive(T, gen):
    x = torch.randn(3, 2 * T, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(3, 2, T, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(3, generator=gen, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: naive_eq_linear(x, w, b, T), (x, w, b))


def _autograd_grads(x, planes, b, gy, T):
    x = x.detach().requires_grad_()
    planes = planes.detach().requires_grad_()
    b = b.detach().requires_grad_()
    y = fourier_eq_linear(x, planes, b, T)
    return torch.autograd.grad(y, (x, planes, b), gy)


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("c, d", [(3, 7), (7, 3), (1, 1)])
def test_closed_form_backward_matches_autograd(T, c, d, gen):
    x = torch.randn(2, 3, c * T, generator=gen, dtype=F64)
    planes = torch.randn(T, d, c, generator=gen, dtype=F64)
    b = torch.randn(d, generator=gen, dtype=F64)
    gy = torch.randn(2, 3, d * T, generator=gen, dtype=F64)
    gx, gp, gb = fourier_eq_linear_backward(gy, x, planes)
    ex, ep, eb = _autograd_grads(x, planes, b, gy, T)
    assert gx.shape == x.shape and gp.shape == planes.shape and gb.shape == (d,)
    assert rel_l2(gx, ex) < 1e-13
    assert rel_l2(gp, ep) < 1e-13
    assert rel_l2(gb, eb) < 1e-13


@pytest.mark.parametrize("T", [3, 4])
@pytest.mark.parametrize(
    "needs", [(True, False, False), (False, True, False), (False, False, True), (False, True, True)]
)
def test_closed_form_backward_partial_needs(T, needs, gen):
    c, d = 3, 2
    x = torch.randn(4, c * T, generator=gen, dtype=F64)
    planes = torch.randn(T, d, c, generator=gen, dtype=F64)
    b = torch.randn(d, generator=gen, dtype=F64)
    gy = torch.randn(4, d * T, generator=gen, dtype=F64)
    got = fourier_eq_linear_backward(gy, x, planes, needs)
    expect = _autograd_grads(x, planes, b, gy, T)
    for need, g, e in zip(needs, got, expect, strict=True):
        if need:
            assert rel_l2(g, e) < 1e-13
        else:
            assert g is None


# ---------------------------------------------------------------------------------------------
# The p4 kernel math (csrc/eq_linear_fwd.h) written out in torch
# ---------------------------------------------------------------------------------------------


def _p4_kernel_math(x, planes, bias):
    """Prologue / six products / epilogue exactly as documented in csrc/eq_linear_fwd.h."""
    c = planes.shape[2]
    X = x.reshape(-1, c, 4)
    x0, x1, x2, x3 = X.unbind(-1)
    f0 = x0 + x1 + x2 + x3
    fR = x0 - x2
    fI = x3 - x1
    f2 = x0 - x1 + x2 - x3
    P0, PR, PI, P2 = planes.unbind(0)
    a0 = f0 @ P0.t()
    a2 = f2 @ P2.t()
    aR = fR @ PR.t() - fI @ PI.t()
    aI = fR @ PI.t() + fI @ PR.t()
    h = math.sqrt(2) / 2
    y0 = a0 / 2 + a2 / 2 + h * aR
    y1 = a0 / 2 - a2 / 2 - h * aI
    y2 = a0 / 2 + a2 / 2 - h * aR
    y3 = a0 / 2 - a2 / 2 + h * aI
    y = torch.stack([y0, y1, y2, y3], -1)
    if bias is not None:
        y = y + bias[:, None]
    return y.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("c, d", [(1, 1), (3, 5), (8, 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_p4_kernel_formulas_match_reference(c, d, bias, gen):
    x, w, b = _problem(4, c, d, gen, n=7, bias=bias)
    planes = fe.naive_to_planes(w)
    y = _p4_kernel_math(x, planes, b)
    assert rel_l2(y, fourier_eq_linear(x, planes, b, 4)) < 1e-13
    assert rel_l2(y, loop_eq_linear(x, w, b)) < 1e-13


# ---------------------------------------------------------------------------------------------
# Shapes, layouts, dtypes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("f", ["naive", "fourier"])
@pytest.mark.parametrize("lead", [(2, 3, 5), (7,), (), (0,), (2, 0)])
def test_leading_and_empty_batch_dims(f, lead, gen):
    T, c, d = 4, 3, 2
    w = torch.randn(d, c, T, generator=gen, dtype=F64)
    b = torch.randn(d, generator=gen, dtype=F64)
    x = torch.randn(*lead, c * T, generator=gen, dtype=F64)
    y = naive_eq_linear(x, w, b, T) if f == "naive" else fourier_eq_linear(x, fe.naive_to_planes(w), b, T)
    assert y.shape == (*lead, d * T)
    expect = loop_eq_linear(x.reshape(-1, c * T), w, b).reshape(*lead, d * T)
    torch.testing.assert_close(y, expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T", [3, 4])
def test_empty_batch_backward(T, gen):
    x = torch.randn(0, 2 * T, dtype=F64, requires_grad=True)
    planes = torch.randn(T, 3, 2, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(3, generator=gen, dtype=F64, requires_grad=True)
    fourier_eq_linear(x, planes, b, T).sum().backward()
    assert x.grad.shape == x.shape
    assert torch.count_nonzero(planes.grad) == 0 and torch.count_nonzero(b.grad) == 0


@pytest.mark.parametrize("T", [3, 4])
def test_non_contiguous_input(T, gen):
    c, d = 3, 2
    w = torch.randn(d, c, T, generator=gen, dtype=F64)
    b = torch.randn(d, generator=gen, dtype=F64)
    planes = fe.naive_to_planes(w)
    base = torch.randn(c * T, 6, generator=gen, dtype=F64)
    xt = base.t()  # (6, C) transposed view
    xs = torch.randn(6, 2 * c * T, generator=gen, dtype=F64)[:, ::2]  # strided view
    x3 = torch.randn(4, 5, c * T, generator=gen, dtype=F64).transpose(0, 1)  # (5, 4, C)
    for x in (xt, xs, x3):
        assert not x.is_contiguous()
        expect = loop_eq_linear(x.contiguous().reshape(-1, c * T), w, b).reshape(*x.shape[:-1], d * T)
        torch.testing.assert_close(fourier_eq_linear(x, planes, b, T), expect, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(naive_eq_linear(x, w, b, T), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 3e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("T", [2, 3, 4])
def test_low_precision_cpu(dtype, tol, T, gen):
    c, d = 16, 8
    x, w, b = _problem(T, c, d, gen, n=33)
    y64 = naive_eq_linear(x, w, b, T)
    planes = fe.naive_to_planes(w)
    y = fourier_eq_linear(x.to(dtype), planes.to(dtype), b.to(dtype), T)
    assert y.dtype == dtype and torch.isfinite(y).all()
    err = rel_l2(y, y64)
    # PyTorch's own low-precision path (dense F.linear in the same dtype) as the yardstick.
    err_base = rel_l2(naive_eq_linear(x.to(dtype), w.to(dtype), b.to(dtype), T), y64)
    assert err < tol
    # The reference path rounds x's and y's transforms too: allow 4x, floored at u/8 for tiny sizes.
    u = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
    assert err <= 4 * max(err_base, u / 8), (err, err_base)


def test_functional_flash_eq_linear_matches_reference(gen):
    x, w, b = _problem(4, 3, 5, gen)
    planes = fe.naive_to_planes(w)
    assert rel_l2(fe.flash_eq_linear(x, planes, b, group_size=4), naive_eq_linear(x, w, b, 4)) < 1e-13
    assert rel_l2(fe.flash_eq_linear(x, planes, None, 4), naive_eq_linear(x, w, None, 4)) < 1e-13


# ---------------------------------------------------------------------------------------------
# fp16 / bf16 near the top of their range: the Fourier path keeps nn.Linear's range
# ---------------------------------------------------------------------------------------------

# (value near the top of the range, the scale of randn inputs); fp16: the 33000 and randn * 2e4.
TOP = {torch.float16: (33000.0, 2e4), torch.bfloat16: (1e38, 6e37)}
RANGE_SIZES = [(4, 32, 32), (8, 16, 16), (3, 24, 16)]  # (T, c, d)


def _rounded(t, dtype):
    return t.to(dtype).to(F64)


def _fp64_layer(x, planes, b, T):
    """The float64 reference of a layer with these (float64) inputs: the dense expansion."""
    return naive_eq_linear(x, fe.planes_to_naive(planes), b, T)


def _gaussian(shape, dtype, gen):
    """Gaussian values near the top of dtype's range (TOP's scale), clamped into it, exact in dtype."""
    bound = 0.9 * torch.finfo(dtype).max
    return _rounded(
        (torch.randn(shape, generator=gen, dtype=F64) * TOP[dtype][1]).clamp(-bound, bound), dtype
    )


def _near_top(dtype, T, c, d, kind, gen, n=16):
    """(x, planes, bias), float64 values exact in ``dtype``: x near the top of dtype's range ("const": every
    entry the top value, the group transform's worst case; "randn": a Gaussian clamped into the range), the
    planes scaled so that the float64 output's largest entry is half the top value (so the dense form in
    dtype stays finite)."""
    top = TOP[dtype][0]
    x = _rounded(torch.full((n, c * T), top, dtype=F64), dtype) if kind == "const" else None
    x = _gaussian((n, c * T), dtype, gen) if x is None else x
    planes = fe.naive_to_planes(torch.randn(d, c, T, generator=gen, dtype=F64))
    planes = _rounded(planes * (top / 2 / _fp64_layer(x, planes, None, T).abs().max()), dtype)
    b = _rounded(torch.randn(d, generator=gen, dtype=F64) * top / 16, dtype)
    return x, planes, b


def _forms(monkeypatch):
    """Each pure-PyTorch form, called directly and through flash_eq_linear with reference_form forced."""

    def via_layer(form):
        def f(x, planes, b, T):
            monkeypatch.setattr(fe.ops, "reference_form", lambda *args, **kwargs: form)
            return fe.flash_eq_linear(x, planes, b, T)

        return f

    def dense(x, planes, b, T):
        return naive_eq_linear(x, fe.ops.rounded_group_weight(planes), b, T)

    return {"fourier": fourier_eq_linear, "dense": dense, "layer fourier": via_layer("fourier")} | {
        "layer dense": via_layer("dense")
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T, c, d", RANGE_SIZES)
@pytest.mark.parametrize("kind", ["const", "randn"])
@pytest.mark.parametrize("form", ["fourier", "dense", "layer fourier", "layer dense"])
def test_low_precision_near_top_of_range(dtype, T, c, d, kind, form, gen, monkeypatch):
    """Inputs near the top of fp16 / bf16's range (fp16: 33000, randn * 2e4): every form finite and within
    twice the dense form's error against float64 (the Fourier path transforms in FP32, rounds once)."""
    x, planes, b = _near_top(dtype, T, c, d, kind, gen)
    want = _fp64_layer(x, planes, b, T)
    forms = _forms(monkeypatch)
    dense = forms["dense"](x.to(dtype), planes.to(dtype), b.to(dtype), T)
    assert torch.isfinite(dense).all()  # the yardstick: nn.Linear's range
    y = forms[form](x.to(dtype), planes.to(dtype), b.to(dtype), T)
    assert y.dtype == dtype and y.shape == want.shape
    assert torch.isfinite(y).all(), f"{form}: {(~torch.isfinite(y)).sum().item()} of {y.numel()} not finite"
    u = ROUNDOFF[dtype]
    err, err_dense = rel_l2(y, want), rel_l2(dense, want)
    assert err <= 2 * max(err_dense, u / 8), (err, err_dense)


def _grads(f, x, planes, b, gy, T, dtype):
    leaves = [t.to(dtype).requires_grad_() for t in (x, planes)]
    bias = None if b is None else b.to(dtype).requires_grad_()
    y = f(*leaves, bias, T)
    wrt = leaves if bias is None else [*leaves, bias]
    return torch.autograd.grad(y, wrt, gy.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T, c, d", RANGE_SIZES)
@pytest.mark.parametrize("big", ["x", "grad_y"])
@pytest.mark.parametrize("form", ["fourier", "dense", "layer fourier"])
def test_low_precision_gradients_near_top_of_range(dtype, T, c, d, big, form, gen, monkeypatch):
    """The backward near the top of the range where nn.Linear's is finite. "x": x near the top (as in the
    forward test), the output gradient scaled so that the largest float64 gradient is half the top value;
    "grad_y": the output gradient near the top, the planes scaled so that grad_x's largest entry is half the
    top value and x so that the planes' is (no bias gradient there: it would leave the range). Finite and
    within twice the dense form's error against float64."""
    top = TOP[dtype][0]
    x, planes, b = _near_top(dtype, T, c, d, "randn", gen)
    gy = torch.randn(*x.shape[:-1], d * T, generator=gen, dtype=F64)
    if big == "x":
        gy = _rounded(gy * (top / 2 / max(g.abs().max() for g in _fp64_grads(x, planes, b, gy, T))), dtype)
    else:
        b = None
        gy = _gaussian(gy.shape, dtype, gen)
        planes = _rounded(planes * (top / 2 / _fp64_grads(x, planes, b, gy, T)[0].abs().max()), dtype)
        x = _rounded(x * (top / 2 / _fp64_grads(x, planes, b, gy, T)[1].abs().max()), dtype)
    want = _fp64_grads(x, planes, b, gy, T)
    forms = _forms(monkeypatch)
    dense = _grads(forms["dense"], x, planes, b, gy, T, dtype)
    assert all(torch.isfinite(g).all() for g in dense)  # the yardstick: nn.Linear's range
    got = _grads(forms[form], x, planes, b, gy, T, dtype)
    u = ROUNDOFF[dtype]
    for k, (g, gd, w) in enumerate(zip(got, dense, want, strict=True)):
        assert g.dtype == dtype and torch.isfinite(g).all(), (form, k)
        err, err_dense = rel_l2(g, w), rel_l2(gd, w)
        assert err <= 2 * max(err_dense, u / 8), (form, k, err, err_dense)


def _fp64_grads(x, planes, b, gy, T):
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes)]
    bias = None if b is None else b.detach().clone().requires_grad_()
    y = _fp64_layer(*leaves, bias, T)
    return torch.autograd.grad(y, leaves if bias is None else [*leaves, bias], gy)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("T", [3, 4, 8])
def test_closed_form_backward_near_top_of_range(dtype, T, gen):
    """fourier_eq_linear_backward (the fused kernels' create_graph path) in fp16 / bf16 with x near the top
    of the range: finite, close to float64."""
    c, d = 16, 16
    top = TOP[dtype][0]
    x, planes, _ = _near_top(dtype, T, c, d, "const", gen)
    gy = torch.randn(x.shape[0], d * T, generator=gen, dtype=F64)
    ref = fourier_eq_linear_backward(gy, x, planes)
    gy = _rounded(gy * (top / 2 / max(g.abs().max() for g in ref)), dtype)
    want = fourier_eq_linear_backward(gy, x, planes)
    got = fourier_eq_linear_backward(gy.to(dtype), x.to(dtype), planes.to(dtype))
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == dtype and torch.isfinite(g).all(), k
        assert rel_l2(g, w) < ROUNDOFF[dtype], k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_under_autocast(dtype, gen):
    """Autocast does not narrow the Fourier path's FP32 transforms back to 16 bits."""
    T, c, d = 4, 32, 32
    x, planes, b = _near_top(dtype, T, c, d, "const", gen)
    want = _fp64_layer(x, planes, b, T)
    with torch.autocast("cpu", dtype=dtype):
        y = fourier_eq_linear(x.to(dtype), planes.to(dtype), b.to(dtype), T)
    assert y.dtype == dtype and torch.isfinite(y).all()
    assert rel_l2(y, want) < ROUNDOFF[dtype]
