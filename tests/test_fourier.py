"""Orthonormal real DFT along the group axis and the weight <-> planes conversions."""

import math

import pytest
import torch
from conftest import GROUP_SIZES, rel_l2

import flash_eqlinear as fe
from flash_eqlinear.fourier import dft_basis, plane_kinds


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("d, c", [(1, 1), (3, 7), (16, 3)])
def test_round_trip_naive_planes_naive(T, d, c, gen):
    w = torch.randn(d, c, T, generator=gen, dtype=torch.float64)
    planes = fe.naive_to_planes(w)
    assert planes.shape == (T, d, c)
    torch.testing.assert_close(fe.planes_to_naive(planes), w, rtol=0, atol=1e-13)


@pytest.mark.parametrize("T", GROUP_SIZES)
def test_round_trip_planes_naive_planes(T, gen):
    planes = torch.randn(T, 5, 3, generator=gen, dtype=torch.float64)
    w = fe.planes_to_naive(planes)
    assert w.shape == (5, 3, T)
    torch.testing.assert_close(fe.naive_to_planes(w), planes, rtol=0, atol=1e-13)


@pytest.mark.parametrize("T", GROUP_SIZES)
def test_round_trip_float32(T, gen):
    w = torch.randn(4, 6, T, generator=gen)
    back = fe.planes_to_naive(fe.naive_to_planes(w))
    assert back.dtype == torch.float32
    assert rel_l2(back, w) < 1e-6


@pytest.mark.parametrize("T", GROUP_SIZES)
def test_dft_basis_orthogonal(T):
    Q = dft_basis(T)
    assert Q.shape == (T, T) and Q.dtype == torch.float64
    eye = torch.eye(T, dtype=torch.float64)
    torch.testing.assert_close(Q @ Q.t(), eye, rtol=0, atol=1e-14)
    torch.testing.assert_close(Q.t() @ Q, eye, rtol=0, atol=1e-14)


@pytest.mark.parametrize("T", GROUP_SIZES)
def test_conversion_is_isometry(T, gen):
    """Orthogonal map: norms and inner products are preserved (what makes SGD equivalent)."""
    a = torch.randn(3, 4, T, generator=gen, dtype=torch.float64)
    b = torch.randn(3, 4, T, generator=gen, dtype=torch.float64)
    pa, pb = fe.naive_to_planes(a), fe.naive_to_planes(b)
    assert math.isclose((pa * pb).sum().item(), (a * b).sum().item(), rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(pa.norm().item(), a.norm().item(), rel_tol=1e-12)


@pytest.mark.parametrize("T", GROUP_SIZES)
def test_plane_kinds_match_basis_rows(T):
    kinds = plane_kinds(T)
    assert len(kinds) == T
    assert kinds[0] == ("real", 0)
    Q = dft_basis(T)
    s = torch.arange(T, dtype=torch.float64)
    for row, (kind, k) in zip(Q, kinds, strict=True):
        angle = 2 * math.pi * k * s / T
        if kind == "real":
            expect = torch.cos(angle) / math.sqrt(T)
        elif kind == "re":
            expect = math.sqrt(2 / T) * torch.cos(angle)
        else:
            expect = math.sqrt(2 / T) * torch.sin(angle)
        torch.testing.assert_close(row, expect, rtol=0, atol=1e-14)


def test_p4_planes_match_design_formulas(gen):
    w = torch.randn(5, 3, 4, generator=gen, dtype=torch.float64)
    w0, w1, w2, w3 = w.unbind(-1)
    P0, PR, PI, P2 = fe.naive_to_planes(w).unbind(0)
    r2 = math.sqrt(2)
    torch.testing.assert_close(P0, (w0 + w1 + w2 + w3) / 2, rtol=0, atol=1e-14)
    torch.testing.assert_close(PR, (w0 - w2) / r2, rtol=0, atol=1e-14)
    torch.testing.assert_close(PI, (w1 - w3) / r2, rtol=0, atol=1e-14)
    torch.testing.assert_close(P2, (w0 - w1 + w2 - w3) / 2, rtol=0, atol=1e-14)


def test_p4_plane_formulas_are_not_transposed(gen):
    """Planes are (T, d, c): with d != c, plane j must be a (d, c) matrix of the (d, c) weights."""
    w = torch.zeros(2, 3, 4, dtype=torch.float64)
    w[1, 2, 1] = 1.0  # only w1 at (o=1, ci=2)
    planes = fe.naive_to_planes(w)
    expect = torch.zeros(4, 2, 3, dtype=torch.float64)
    expect[0, 1, 2] = 0.5
    expect[2, 1, 2] = 1 / math.sqrt(2)  # PI = (w1 - w3)/sqrt2
    expect[3, 1, 2] = -0.5  # P2 = (w0 - w1 + w2 - w3)/2
    torch.testing.assert_close(planes, expect, rtol=0, atol=1e-15)


@pytest.mark.parametrize("T", GROUP_SIZES)
def test_conversions_differentiable(T, gen):
    w = torch.randn(2, 3, T, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fe.naive_to_planes, (w,))
    p = torch.randn(T, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fe.planes_to_naive, (p,))


def test_dft_basis_dtype_and_device():
    Q = dft_basis(4, dtype=torch.float32, device="cpu")
    assert Q.dtype == torch.float32 and Q.device.type == "cpu"
    assert dft_basis(4, device="meta").device.type == "meta"


@pytest.mark.parametrize(
    "fn, arg, exc, match",
    [
        (fe.naive_to_planes, torch.zeros(2, 3, 4, dtype=torch.int64), TypeError, "floating"),
        (fe.planes_to_naive, torch.zeros(4, 2, 3, dtype=torch.int32), TypeError, "floating"),
        (fe.naive_to_planes, torch.zeros(2, 4), ValueError, r"\(d, c, T\)"),
        (fe.planes_to_naive, torch.zeros(1, 4, 2, 3), ValueError, r"\(T, d, c\)"),
        (fe.naive_to_planes, [[1.0]], TypeError, "torch.Tensor"),
    ],
)
def test_conversion_errors(fn, arg, exc, match):
    with pytest.raises(exc, match=match):
        fn(arg)
