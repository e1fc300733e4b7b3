"""flash_eq_mlp on CUDA: fc2(GELU(fc1(x))) with GELU and its derivative fused into the layers' kernels.

Same criterion as the layer's tests: errors against float64 within twice those of the dense
F.linear / GELU / F.linear composition in the same dtype (floored at u/8); the fused and the unfused
paths agree to rounding; the fused path really leaves no GELU pass (Hopper).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_l2

import flash_eqlinear as fe
from flash_eqlinear import reference
from flash_eqlinear.models.layers import Mlp, Variant
from flash_eqlinear.ops import kernel_import_error

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: fused-kernel tests skipped", allow_module_level=True)
if not fe.kernels_available():
    pytest.skip(f"fused kernels not built: {kernel_import_error()}", allow_module_level=True)

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
HOPPER = torch.cuda.get_device_capability()[0] == 9
# (M, c, h, d): Hopper-kernel layers (c, h % 8 == 0), a ViT-B-like MLP, odd and narrow layers (the other
# kernels, GELU as its own pass), an empty input
SHAPES = [(129, 48, 192, 48), (1000, 192, 768, 192), (257, 59, 200, 48), (7, 3, 12, 5), (4097, 64, 256, 40)]
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
def test_mlp_forward_and_grads_against_fp64(M, c, h, d, dtype):
    inputs = make(M, c, h, d, dtype)
    g = torch.randn(M, 4 * d, device=DEV)
    y, grads = grads_of(fe.flash_eq_mlp, inputs, g)
    y64, grads64 = grads_of(lambda *t: dense_mlp(*t, torch.float64), [t.double() for t in inputs], g)
    yl, gradsl = grads_of(lambda *t: dense_mlp(*t, dtype), inputs, g)
    assert y.dtype == dtype and y.shape == (M, 4 * d)
    if M == 0:
        assert all(not t.abs().sum() for t in grads[1:] if t.numel())
        return
    floor = ROUNDOFF[dtype] / 8
    assert rel_l2(y, y64) <= 2 * max(rel_l2(yl, y64), floor), (rel_l2(y, y64), rel_l2(yl, y64))
    if dtype == torch.float32:
        assert rel_l2(y, y64) < 1e-5
    # Every gradient (the weights' as planes: the dense composition's reach its planes through the
    # expansion) within twice the dense composition's error.
    for k, name in enumerate(("x", "w1", "b1", "w2", "b2")):
        tol = 2 * max(rel_l2(gradsl[k], grads64[k]), floor)
        err = rel_l2(grads[k], grads64[k])
        assert grads[k].dtype == dtype and err <= tol, (name, err, tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, h, d", SHAPES)
def test_mlp_fused_and_unfused_agree(M, c, h, d, dtype, monkeypatch):
    # The same function: the unfused calls round GELU's input gradient once more, nothing else differs.
    inputs = make(M, c, h, d, dtype, seed=1)
    g = torch.randn(M, 4 * d, device=DEV)
    y, grads = grads_of(fe.flash_eq_mlp, inputs, g)
    monkeypatch.setenv("FLASH_EQLINEAR_FUSED_MLP", "0")
    yu, gradsu = grads_of(fe.flash_eq_mlp, inputs, g)
    u = ROUNDOFF[dtype]
    assert rel_l2(y, yu) <= u, rel_l2(y, yu)
    for k, (a, b) in enumerate(zip(grads, gradsu, strict=True)):
        assert rel_l2(a, b) <= 4 * u, (k, rel_l2(a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mlp_inference_output_equals_training_output(dtype):
    inputs = make(1000, 48, 192, 40, dtype, seed=2)
    with torch.no_grad():
        y_inf = fe.flash_eq_mlp(*inputs)
    leaves = [t.clone().requires_grad_() for t in inputs]
    y_train = fe.flash_eq_mlp(*leaves)
    assert torch.equal(y_inf, y_train.detach())


@pytest.mark.skipif(not HOPPER, reason="the GELU epilogues are the Hopper kernel's (sm_90)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mlp_fusion_leaves_no_gelu_pass(dtype, monkeypatch):
    inputs = make(3000, 192, 768, 192, dtype, seed=3)
    leaves = [t.clone().requires_grad_() for t in inputs]

    def kernels():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fe.flash_eq_mlp(*leaves).sum().backward()
            torch.cuda.synchronize()
        return [e.name.lower() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    fused = kernels()
    assert not [k for k in fused if "gelu" in k], fused
    assert any("eq_linear_fwd_sm90" in k for k in fused), fused
    monkeypatch.setenv("FLASH_EQLINEAR_FUSED_MLP", "0")
    unfused = kernels()
    assert sum("gelu" in k for k in unfused) == 2, unfused  # GELU and its backward


def test_mlp_module_and_compile():
    # The models' Mlp takes flash_eq_mlp (same function as its unfused modules); it compiles as one graph
    # and a training step of it matches eager.
    torch.manual_seed(0)
    mlp = Mlp(Variant("flash"), 192, 768).to(DEV)
    x = torch.randn(2, 97, 192, device=DEV, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = mlp(x)
        y_unfused = mlp.fc2(mlp.act(mlp.fc1(x)))
    assert y.dtype == torch.bfloat16 and rel_l2(y, y_unfused) <= 2.0**-8
    compiled = torch.compile(mlp, fullgraph=True)
    xc = x.detach().clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yc = compiled(xc)
    assert torch.equal(yc, y)
    y.float().square().sum().backward()
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    yc.float().square().sum().backward()
    assert torch.equal(xc.grad, x.grad)
    for a, b in zip(grads, [p.grad for p in mlp.parameters()], strict=True):
        assert torch.equal(a, b)


def test_mlp_hooks_run_the_modules():
    mlp = Mlp(Variant("flash"), 64, 256).to(DEV)
    seen = []
    mlp.fc1.register_forward_hook(lambda m, i, o: seen.append("fc1"))
    mlp(torch.randn(5, 64, device=DEV))
    assert seen == ["fc1"]


def test_mlp_double_backward_fp32():
    # create_graph: the gradients are differentiable (a gradient penalty's second order against float64).
    inputs = make(65, 16, 64, 24, torch.float32, seed=4)

    def second_order(x, w1, b1, w2, b2, fn):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w1, b1, w2, b2)]
        y = fn(*leaves)
        (gx,) = torch.autograd.grad(y.square().sum(), leaves[0], create_graph=True)
        gx.square().sum().backward()
        return [t.grad for t in leaves]

    ours = second_order(*inputs, fe.flash_eq_mlp)
    ref = second_order(*[t.double() for t in inputs], lambda *t: dense_mlp(*t, torch.float64))
    for k, (a, r) in enumerate(zip(ours, ref, strict=True)):
        assert rel_l2(a, r) < 1e-5, (k, rel_l2(a, r))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mlp_opcheck(dtype):
    x, w1, b1, w2, b2 = make(37, 16, 64, 24, dtype)
    ops = torch.ops.flash_eqlinear
    for keep in (True, False):
        torch.library.opcheck(ops.eq_linear_fwd_gelu.default, (x, w1, b1, keep))
    a, pre = ops.eq_linear_fwd_gelu(x, w1, b1, True)
    torch.library.opcheck(ops.eq_linear_fwd_gelu_in.default, (a, pre, w2, b2))
    leaves = tuple(t.detach().clone().requires_grad_() for t in (x, w1, b1))
    torch.library.opcheck(ops.eq_linear_fwd_gelu.default, (*leaves, True))
    leaves = tuple(t.detach().clone().requires_grad_() for t in (a, pre, w2, b2))
    torch.library.opcheck(ops.eq_linear_fwd_gelu_in.default, leaves)
    gy = torch.randn(37, 96, device=DEV, dtype=dtype)
    torch.library.opcheck(ops.eq_linear_bwd.default, (gy, a, w2, True, True, True, False, pre))


def test_mlp_misuse_raises():
    x, w1, b1, w2, b2 = make(8, 16, 64, 24, torch.float32)
    with pytest.raises(ValueError, match="weight2"):
        fe.flash_eq_mlp(x, w1, b1, w2[:, :, :-1], b2)
    with pytest.raises(RuntimeError, match="dtype"):
        fe.flash_eq_mlp(x, w1, b1, w2.half(), b2)
    with pytest.raises(ValueError, match="bias"):
        fe.flash_eq_mlp(x, w1, b1, w2, b2[:-1])
    ops = torch.ops.flash_eqlinear
    a, pre = ops.eq_linear_fwd_gelu(x, w1, b1, True)
    with pytest.raises(RuntimeError, match="pre"):
        ops.eq_linear_fwd_gelu_in(a, pre[:-1], w2, b2)
    gy = torch.randn(8, 96, device=DEV)
    with pytest.raises(RuntimeError, match="gelu_pre"):
        ops.eq_linear_bwd(gy, a, w2, True, True, True, False, pre[:, :-4])
