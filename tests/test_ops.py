"""flash_eq_linear off the fused kernels: the pure-PyTorch form chosen by size, both exact."""

import pytest
import torch
from conftest import GROUP_SIZES, loop_eq_linear, rel_l2

import flash_eqlinear as fe
from flash_eqlinear import reference
from flash_eqlinear.ops import reference_form

F64 = torch.float64
CPU = torch.empty(0)


@pytest.mark.parametrize(
    "T, c, d, form",
    [
        (4, 16, 16, "dense"),
        (4, 128, 128, "dense"),
        (4, 256, 256, "fourier"),
        (2, 1024, 1024, "dense"),
        (8, 64, 64, "dense"),
        (8, 128, 128, "fourier"),
        (16, 64, 64, "fourier"),
        (4, 64, 1024, "fourier"),  # T * sqrt(c * d) = 1024
        (1, 4096, 4096, "dense"),
    ],
)
def test_form_by_size(T, c, d, form):
    assert reference_form(CPU, T, c, d) == form


def test_forced_reference_backend_takes_fourier(monkeypatch):
    monkeypatch.setattr(fe.ops, "BACKEND", "reference")
    assert reference_form(CPU, 4, 8, 8) == "fourier"


def test_accelerators_take_dense():
    meta = torch.empty(0, device="meta")
    assert reference_form(meta, 16, 512, 512) == "dense"


@pytest.mark.parametrize("form", ["dense", "fourier"])
@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("bias", [True, False])
def test_both_forms_exact_with_gradients(form, T, bias, monkeypatch, gen):
    monkeypatch.setattr(fe.ops, "reference_form", lambda *args: form)
    other = "fourier_eq_linear" if form == "dense" else "naive_eq_linear"

    def unused(*args, **kwargs):
        raise AssertionError(f"the {form} form called reference.{other}")

    monkeypatch.setattr(reference, other, unused)
    c, d = 3, 5
    w = torch.randn(d, c, T, generator=gen, dtype=F64)
    b = torch.randn(d, generator=gen, dtype=F64) if bias else None
    planes = fe.naive_to_planes(w).requires_grad_()
    x = torch.randn(2, 7, c * T, generator=gen, dtype=F64, requires_grad=True)
    y = fe.flash_eq_linear(x, planes, b, T)
    assert rel_l2(y, loop_eq_linear(x.detach(), w, b)) < 1e-13
    gy = torch.randn_like(y)
    gx, gp = torch.autograd.grad(y, (x, planes), gy)
    w64, xr = w.clone().requires_grad_(), x.detach().clone().requires_grad_()
    rx, rw = torch.autograd.grad(loop_eq_linear(xr, w64, b), (xr, w64), gy)
    assert rel_l2(gx, rx) < 1e-12
    assert rel_l2(gp, fe.naive_to_planes(rw)) < 1e-12  # planes are an orthogonal map of w


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_form_low_precision(dtype, gen):
    """fp16 / bf16 planes: the group-domain weight is computed in float32 and rounded once."""
    T, c, d = 4, 16, 24
    w = torch.randn(d, c, T, generator=gen, dtype=F64) / 8
    x = torch.randn(64, c * T, generator=gen, dtype=F64)
    planes = fe.naive_to_planes(w).to(dtype)
    assert reference_form(CPU, T, c, d) == "dense"
    y = fe.flash_eq_linear(x.to(dtype), planes, None, T)
    assert y.dtype == dtype
    expect = loop_eq_linear(x.to(dtype).double(), fe.planes_to_naive(planes.double()), None)
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    assert rel_l2(y, expect) < tol
