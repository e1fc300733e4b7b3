"""Shared helpers for the test suite.

``RefEQLinear`` is written the way existing reference-style EQ-Linear layers are: a
Parameter ``weights`` (d, 1, c, T), a bias Parameter ``c`` (d, 1) and an attribute ``tranNum``;
the dense matrix is built by rolling ``weights`` by t along the last axis for output copy t.
It is deliberately independent of ``flash_eqlinear.reference.dense_weight`` (torch.roll + cat
instead of index arithmetic) so that comparing against it really checks the convention.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import flash_eqlinear as fe
from flash_eqlinear import reference

GROUP_SIZES = [1, 2, 3, 4, 5, 6, 8]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative L2 error ||a - b|| / ||b||, computed in float64 (0 when both are empty/zero)."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    assert a.shape == b.shape, f"shape mismatch {tuple(a.shape)} vs {tuple(b.shape)}"
    den = b.norm().item()
    num = (a - b).norm().item()
    if den == 0.0:
        return num
    return num / den


def require_cuda_kernels() -> None:
    """Skips the calling test module, with the reason, where there is no CUDA GPU or no built extension; with
    FLASH_EQLINEAR_REQUIRE_KERNELS=1 (the GPU run script sets it) a GPU without the built kernels fails it."""
    # (pytest's summary line names this file; the reason names the module)
    module = Path(sys._getframe(1).f_code.co_filename).name
    if not torch.cuda.is_available():
        pytest.skip(f"{module}: no CUDA GPU, fused-kernel tests skipped", allow_module_level=True)
    if not fe.kernels_available():
        why = f"{module}: fused kernels not built: {fe.ops.kernel_import_error()}"
        if os.environ.get("FLASH_EQLINEAR_REQUIRE_KERNELS", "0") == "1":  # a GPU machine's runs: an error
            pytest.fail(f"{why} (FLASH_EQLINEAR_REQUIRE_KERNELS=1)", pytrace=False)
        pytest.skip(why, allow_module_level=True)


def debug_env(monkeypatch: pytest.MonkeyPatch, **switches) -> str:
    """Sets names of ``FLASH_EQLINEAR_DEBUG`` (``"name=value,name=value"``) for the test through
    ``monkeypatch.setenv``: the variable's current items (it may be unset or empty) are kept, the given
    names added or overridden (values converted with ``str()``; ``None`` removes a name, the library's
    default), e.g. ``debug_env(monkeypatch, narrow=0, products="gemm")``. Several calls in one test
    accumulate (a later call keeps the earlier names); monkeypatch restores the variable afterwards.
    Returns the new value."""
    items: dict[str, str] = {}
    for item in os.environ.get("FLASH_EQLINEAR_DEBUG", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            items[key.strip()] = value.strip()
    for name, value in switches.items():
        if value is None:
            items.pop(name, None)
        else:
            items[name] = str(value)
    raw = ",".join(f"{name}={value}" for name, value in items.items())
    monkeypatch.setenv("FLASH_EQLINEAR_DEBUG", raw)
    return raw


def check_export(
    model: nn.Module, x: torch.Tensor, x_other: torch.Tensor, path
) -> torch.export.ExportedProgram:
    """torch.export of ``model`` with a dynamic first dimension, traced on ``x``: on ``x_other`` (another
    size of that dimension) the program and its ``torch.export.save`` / ``load`` round trip through ``path``
    must equal eager bit for bit. Returns the exported program."""
    with torch.no_grad():
        ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        want = model(x_other)
        assert torch.equal(ep.module()(x_other), want)
        torch.export.save(ep, path)
        assert torch.equal(torch.export.load(path).module()(x_other), want)
    return ep


def roll_group(t: torch.Tensor, T: int, shifts: int = 1) -> torch.Tensor:
    """Act with r^shifts: cyclic shift of the group axis of a (..., c*T) feature."""
    shape = t.shape
    return torch.roll(t.reshape(*shape[:-1], shape[-1] // T, T), shifts, -1).reshape(shape)


def loop_eq_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Y[n,o,t] = sum_{ci,s} X[n,ci,s] w[o,ci,(s-t) mod T] + b[o], by explicit loops (tiny sizes)."""
    d, c, T = w.shape
    X = x.reshape(-1, c, T)
    Y = torch.zeros(X.shape[0], d, T, dtype=x.dtype)
    for o in range(d):
        for t in range(T):
            acc = torch.zeros(X.shape[0], dtype=x.dtype)
            for ci in range(c):
                for s in range(T):
                    acc = acc + X[:, ci, s] * w[o, ci, (s - t) % T]
            Y[:, o, t] = acc + (0.0 if b is None else b[o])
    return Y.reshape(*x.shape[:-1], d * T)


class RefEQLinear(nn.Module):
    """Reference-style EQ-Linear (reference-style layout): weights (d,1,c,T), bias c (d,1), tranNum."""

    def __init__(self, in_features: int, out_features: int, tranNum: int = 4, bias: bool = True):
        super().__init__()
        self.tranNum = tranNum
        c, d = in_features // tranNum, out_features // tranNum
        bound = 1.0 / math.sqrt(in_features)
        self.weights = nn.Parameter(torch.empty(d, 1, c, tranNum).uniform_(-bound, bound))
        if bias:
            self.c = nn.Parameter(torch.empty(d, 1).uniform_(-bound, bound))
        else:
            self.c = None

    def dense(self) -> torch.Tensor:
        T = self.tranNum
        d, _, c, _ = self.weights.shape
        # Output copy t uses the weights rolled by t along the group axis: row (o, t) = roll(w[o], t).
        rows = [torch.roll(self.weights, t, -1) for t in range(T)]  # each (d, 1, c, T)
        return torch.cat(rows, dim=1).reshape(d * T, c * T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.dense().t()
        if self.c is not None:
            y = y + self.c.expand(-1, self.tranNum).reshape(-1)
        return y


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded CPU generator (use it for every random tensor a test draws)."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def _seed():
    """Seed the global RNG too, so layer initialisation is reproducible."""
    torch.manual_seed(0)
    yield


# p4 layer helpers of the CUDA test modules (test_fwd_cuda, test_bwd_cuda): inputs, float64 oracles and the
# flash-attention-style criterion (within twice F.linear's error in the same dtype, floored at u / 8).
ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def make(M, c, d, dtype, x_scale=1.0, bias=True, seed=0):
    """(x (M, 4c), planes (4, d, c), bias (d,) or None) on the GPU, seeded, x scaled by x_scale."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, 4 * c, device="cuda", generator=g) * x_scale).to(dtype)
    planes = (torch.randn(4, d, c, device="cuda", generator=g) / (4 * c) ** 0.5).to(dtype)
    b = torch.randn(d, device="cuda", generator=g).to(dtype) if bias else None
    return x, planes, b


def fp64_reference(x, planes, b):
    w = fe.planes_to_naive(planes.double())
    return reference.naive_eq_linear(x.double(), w, None if b is None else b.double(), 4), w


def fp64_grads(x, planes, b, g):
    """(grad_x, grad_planes, grad_bias) of the naive layer in float64 for output gradient g."""
    x64, p64, b64 = [t.detach().double().requires_grad_() for t in (x, planes, b)]
    reference.naive_eq_linear(x64, fe.planes_to_naive(p64), b64, 4).backward(g.double())
    return x64.grad, p64.grad, b64.grad


def linear_grads(x, planes, b, g, dt):
    """(grad_x, grad_W, grad_B) of F.linear with the dense weight, all in dtype dt: the error scale
    a gradient of ours is held to."""
    W = reference.dense_weight(fe.planes_to_naive(planes.double())).to(dt).requires_grad_()
    B = b.to(dt).repeat_interleave(4).detach().requires_grad_()
    xl = x.to(dt).detach().requires_grad_()
    F.linear(xl, W, B).backward(g.to(dt))
    return xl.grad, W.grad, B.grad


def check_grads(grads, x, planes, b, g, dtype, floor):
    """grads = (grad_x, grad_planes, grad_bias) of ours for output gradient g: each within twice the
    relative error of F.linear's matching gradient in dtype (floored at `floor`) against float64; all
    zeros for an empty input."""
    wants = fp64_grads(x, planes, b, g)
    lin, lin64 = linear_grads(x, planes, b, g, dtype), linear_grads(x, planes, b, g, torch.float64)
    for k, (got, want) in enumerate(zip(grads, wants, strict=True)):
        if x.shape[0] == 0:
            assert got.shape == want.shape and not got.abs().sum(), k
            continue
        tol = 2 * max(rel_l2(lin[k], lin64[k]), floor)
        assert got.dtype == dtype and rel_l2(got, want) <= tol, (k, rel_l2(got, want), tol)


def check_against_linear(y, x, planes, b):
    assert y.dtype == x.dtype and torch.isfinite(y).all()
    ref, w = fp64_reference(x, planes, b)
    err = rel_l2(y, ref)
    if x.dtype == torch.float32:
        assert err < 1e-5, err
        return
    W = reference.dense_weight(w).to(x.dtype)
    B = None if b is None else b.repeat_interleave(4)
    lin_err = rel_l2(F.linear(x, W, B), ref)
    assert err <= 2 * max(lin_err, ROUNDOFF[x.dtype] / 8), (err, lin_err)


def launched_kernels(fn):
    """Names of the CUDA kernels that fn() launches, one per launch."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.fixture
def allow_tf32():
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = prev
