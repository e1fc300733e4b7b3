"""flash_eq_mlp on CUDA: fc2(GELU(fc1(x))), in inference with GELU in the first layer's kernel.

Same criterion as the layer's tests: errors against float64 within twice those of the dense
F.linear / GELU / F.linear composition in the same dtype (floored at u/8); the fused and the unfused
paths agree to rounding; the fused path really leaves no GELU pass (Hopper and mma.sync kernels).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import debug_env, rel_l2, require_cuda_kernels

import flash_eqlinear as fe
from flash_eqlinear import reference
from flash_eqlinear.models.layers import Mlp, Variant

require_cuda_kernels()

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
HOPPER = torch.cuda.get_device_capability()[0] == 9
# (M, c, h, d): Hopper-kernel layers (c, h % 8 == 0; h = 512: clusters of two), a ViT-B-like MLP, an odd c
# (the mma.sync kernel), a narrow layer (GELU as its own pass), an empty input
SHAPES = [(129, 48, 192, 48), (1000, 192, 768, 192), (300, 64, 512, 40), (257, 59, 200, 48), (7, 3, 12, 5)]
SHAPES_WITH_EMPTY = SHAPES + [(0, 16, 64, 16)]


def make(M, c, h, d, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, 4 * c, device=DEV, generator=g).to(dtype)
    w1 = (torch.randn(4, h, c, device=DEV, generator=g) / (4 * c) ** 0.5).to(dtype)
    b1 = (0.5 * torch.randn(h, device=DEV, generator=g)).to(dtype)
    w2 = (torch.randn(4, d, h, device=DEV, generator=g) / (4 * h) ** 0.5).to(dtype)
    b2 = torch.randn(d, device=DEV, generator=g).to(dtype)
    return x, w1, b1, w2, b2


def dense_mlp(x, w1, b1, w2, b2, dt):
    """The MLP with dense block-circulant weights by F.linear, in dtype dt (weights rounded to dt)."""

    def lin(t, w, b):
        W = reference.dense_weight(fe.planes_to_naive(w.double())).to(dt)
        return F.linear(t, W, b.to(dt).repeat_interleave(4))

    return lin(F.gelu(lin(x.to(dt), w1, b1)), w2, b2)


def grads_of(fn, inputs, g):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    y.backward(g.to(y.dtype))
    return y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, h, d", SHAPES_WITH_EMPTY)
def test_mlp_against_fp64(M, c, h, d, dtype):
    # Inference (the fused path) and training (output and every gradient) against float64.
    inputs = make(M, c, h, d, dtype)
    g = torch.randn(M, 4 * d, device=DEV)
    with torch.no_grad():
        y_inf = fe.flash_eq_mlp(*inputs)
    y, grads = grads_of(fe.flash_eq_mlp, inputs, g)
    y64, grads64 = grads_of(lambda *t: dense_mlp(*t, torch.float64), [t.double() for t in inputs], g)
    yl, gradsl = grads_of(lambda *t: dense_mlp(*t, dtype), inputs, g)
    assert y_inf.dtype == y.dtype == dtype and y_inf.shape == y.shape == (M, 4 * d)
    if M == 0:
        assert all(not t.abs().sum() for t in grads)
        return
    floor = ROUNDOFF[dtype] / 8
    for out in (y_inf, y):
        assert rel_l2(out, y64) <= 2 * max(rel_l2(yl, y64), floor), (rel_l2(out, y64), rel_l2(yl, y64))
    if dtype == torch.float32:
        assert rel_l2(y_inf, y64) < 1e-5
    # Every gradient (the weights' as planes: the dense composition's reach its planes through the
    # expansion) within twice the dense composition's error (FP32: under 1e-5, as the layer's).
    for k, name in enumerate(("x", "w1", "b1", "w2", "b2")):
        tol = 1e-5 if dtype == torch.float32 else 2 * max(rel_l2(gradsl[k], grads64[k]), floor)
        err = rel_l2(grads[k], grads64[k])
        assert grads[k].dtype == dtype and err <= tol, (name, err, tol)


@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "portable"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, h, d", SHAPES)
def test_mlp_fused_equals_unfused(M, c, h, d, dtype, sm90, monkeypatch):
    # The same kernels compute the product; GELU in the epilogue of the rounded output, as at::gelu does.
    # Each 16-bit path (FLASH_EQLINEAR_SM90=0: the mma.sync kernel).
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1" if sm90 else "0")
    inputs = make(M, c, h, d, dtype, seed=1)
    with torch.no_grad():
        y = fe.flash_eq_mlp(*inputs)
        debug_env(monkeypatch, fused_mlp="0")
        yu = fe.flash_eq_mlp(*inputs)
    assert rel_l2(y, yu) <= ROUNDOFF[dtype] / 4, rel_l2(y, yu)


@pytest.fixture
def allow_tf32(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)


@pytest.mark.parametrize("M, c, h, d", SHAPES)
def test_mlp_tf32(M, c, h, d, allow_tf32, monkeypatch):
    # FP32 with TF32 allowed: GELU in the TF32 Hopper kernel's epilogue where it runs; equal to the unfused
    # calls to FP32 rounding, and against float64 within 3x the TF32 dense composition's error (each layer
    # is held to 2x F.linear's TF32 error; two of them compound: 2.03x seen at (129, 48, 192, 48)).
    inputs = make(M, c, h, d, torch.float32, seed=5)
    with torch.no_grad():
        y = fe.flash_eq_mlp(*inputs)
        y64 = dense_mlp(*[t.double() for t in inputs], torch.float64)
        assert rel_l2(y, y64) <= 3 * rel_l2(dense_mlp(*inputs, torch.float32), y64)
        debug_env(monkeypatch, fused_mlp="0")
        assert rel_l2(y, fe.flash_eq_mlp(*inputs)) <= 1e-6


@pytest.mark.parametrize(
    "dtype, kernel",
    [(torch.float16, "sm90"), (torch.bfloat16, "sm90"), ("tf32", "sm90")]
    + [(torch.float16, "mma"), (torch.bfloat16, "mma")],
    ids=str,
)
def test_mlp_fusion_leaves_no_gelu_pass(dtype, kernel, monkeypatch):
    if kernel == "sm90" and not HOPPER:
        pytest.skip("the Hopper kernel's GELU epilogue (sm_90)")
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1" if kernel == "sm90" else "0")
    if dtype == "tf32":
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
        dtype = torch.float32
    inputs = make(3000, 192, 768, 192, dtype, seed=3)

    def kernels():
        cuda = torch.profiler.ProfilerActivity.CUDA
        with torch.profiler.profile(activities=[cuda]) as prof, torch.no_grad():
            fe.flash_eq_mlp(*inputs)
            torch.cuda.synchronize()
        return [e.name.lower() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    fused = kernels()
    assert not [k for k in fused if "gelu" in k], fused
    assert sum(f"eq_linear_fwd_{kernel}" in k for k in fused) == 2, fused
    debug_env(monkeypatch, fused_mlp="0")
    assert sum("gelu" in k for k in kernels()) == 1


def test_mlp_module_and_compile():
    # The models' Mlp takes flash_eq_mlp (the same function as its modules one by one) and compiles as one
    # graph, in inference (fused) and training.
    torch.manual_seed(0)
    mlp = Mlp(Variant("flash"), 192, 768).to(DEV)
    x = torch.randn(2, 97, 192, device=DEV)
    compiled = torch.compile(mlp, fullgraph=True)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        y, yc = mlp(x), compiled(x)
        y_modules = mlp.fc2(mlp.act(mlp.fc1(x)))
    assert y.dtype == torch.bfloat16 and torch.equal(yc, y) and rel_l2(y, y_modules) <= 2.0**-10
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yt = compiled(x)
    yt.float().square().sum().backward()
    assert rel_l2(yt, y) <= 2.0**-10 and all(p.grad is not None for p in mlp.parameters())


@pytest.mark.parametrize("cast", [torch.float16, torch.bfloat16], ids=str)
def test_mlp_fp32_input_needing_grad_under_autocast(cast):
    """Training under autocast with an FP32 x that needs its gradient (e.g. a stock LayerNorm's output): the
    first layer takes x as it is, the second its output in the autocast dtype; the three calls' values and
    gradients."""
    x, w1, b1, w2, b2 = make(129, 48, 192, 48, torch.float32)
    g = torch.randn(129, 4 * 48, device=DEV)

    def three_calls(x, w1, b1, w2, b2):
        return fe.flash_eq_linear(F.gelu(fe.flash_eq_linear(x, w1, b1)), w2, b2)

    with torch.autocast("cuda", dtype=cast):
        y, grads = grads_of(fe.flash_eq_mlp, (x, w1, b1, w2, b2), g)
        y_ref, want = grads_of(three_calls, (x, w1, b1, w2, b2), g)
    assert y.dtype == cast and grads[0].dtype == torch.float32
    assert torch.equal(y, y_ref)
    for a, b in zip(grads, want, strict=True):
        assert torch.equal(a, b)


def test_mlp_hooks_run_the_modules():
    mlp = Mlp(Variant("flash"), 64, 256).to(DEV)
    seen = []
    mlp.fc1.register_forward_hook(lambda m, i, o: seen.append("fc1"))
    with torch.no_grad():
        mlp(torch.randn(5, 64, device=DEV))
    assert seen == ["fc1"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gelu_op_opcheck_and_grads(dtype):
    # eq_linear_fwd_gelu's own backward (the pre-activation recomputed) equals that of GELU(layer).
    x, w1, b1, _, _ = make(37, 16, 64, 24, dtype)
    op = torch.ops.flash_eqlinear.eq_linear_fwd_gelu
    torch.library.opcheck(op.default, (x, w1, b1))
    torch.library.opcheck(op.default, (x, w1, None))
    torch.library.opcheck(op.default, tuple(t.detach().clone().requires_grad_() for t in (x, w1, b1)))
    g = torch.randn(37, 4 * 64, device=DEV)
    _, grads = grads_of(op, (x, w1, b1), g)
    _, want = grads_of(lambda *t: F.gelu(fe.flash_eq_linear(*t)), (x, w1, b1), g)
    for a, b in zip(grads, want, strict=True):
        assert torch.equal(a, b)


def test_mlp_misuse_raises():
    x, w1, b1, w2, b2 = make(8, 16, 64, 24, torch.float32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="weight2"):
            fe.flash_eq_mlp(x, w1, b1, w2[:, :, :-1], b2)
        with pytest.raises(RuntimeError, match="second layer.*dtype"):
            fe.flash_eq_mlp(x, w1, b1, w2.half(), b2)
        with pytest.raises(ValueError, match="bias"):
            fe.flash_eq_mlp(x, w1, b1, w2, b2[:-1])
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.flash_eqlinear.eq_linear_fwd_gelu(x[:, :-4], w1, b1)
