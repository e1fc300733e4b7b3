"""The fused group LayerNorm (flash_eqlinear::group_layer_norm_fwd / _bwd) on the GPU: forward and backward
against float64, per dtype pair and odd shapes, no less accurate than ``F.layer_norm`` on the same inputs;
reproducible; ``opcheck``; double backward; the module under autocast; torch.compile; misuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_l2, require_cuda_kernels

require_cuda_kernels()

from flash_eqlinear.layer_norm import fused_layer_norm_applies, group_layer_norm  # noqa: E402
from flash_eqlinear.models.layers import GroupLayerNorm  # noqa: E402

DEV = "cuda"
# (x dtype, output dtype): equal, or a float32 x written in any dtype
PAIRS = [
    (torch.float32, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
]
SHAPES = [(1, 1), (7, 3), (129, 33), (1000, 64), (257, 100), (64, 192), (130, 256), (33, 320), (70, 512)]


def expanded(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(-1).expand(-1, 4).reshape(-1)


def stock(x, w, b, out_dtype, eps=1e-5):
    """F.layer_norm with the expanded parameters in x's dtype, cast to out_dtype: the path the op replaces."""
    w, b = expanded(w).to(x.dtype), expanded(b).to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps).to(out_dtype)


def inputs(M, c, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(M, 4 * c, device=DEV, generator=g) * 3 + 1.5).to(dtype)
    w = torch.randn(c, device=DEV, generator=g)
    b = torch.randn(c, device=DEV, generator=g)
    return x, w, b


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{str(p[0])[6:]}-{str(p[1])[6:]}")
@pytest.mark.parametrize("M,c", SHAPES)
def test_forward_and_backward_against_float64(pair, M, c):
    xt, yt = pair
    x, w, b = inputs(M, c, xt)
    gy = torch.randn(M, 4 * c, device=DEV).to(yt)
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    ref = stock(x64, w64, b64, torch.float64)
    ref.backward(gy.double())
    ours_in = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y = group_layer_norm(*ours_in, out_dtype=yt)
    assert y.dtype == yt and y.shape == x.shape
    y.backward(gy)
    base_in = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    yb = stock(*base_in, yt)
    yb.backward(gy)
    for ours, base, want, what in (
        (y, yb, ref, "y"),
        (ours_in[0].grad, base_in[0].grad, x64.grad, "grad_x"),
        (ours_in[1].grad, base_in[1].grad, w64.grad, "grad_weight"),
        (ours_in[2].grad, base_in[2].grad, b64.grad, "grad_bias"),
    ):
        assert ours.dtype == base.dtype, what
        err, base_err = rel_l2(ours, want), rel_l2(base, want)
        tol = 1e-5 if ours.dtype == torch.float32 else 0.0
        assert err <= 2 * base_err + tol, f"{what}: {err:.3g} against F.layer_norm's {base_err:.3g}"


def test_mean_and_rstd():
    x, w, b = inputs(300, 96, torch.float32)
    y, mean, rstd = torch.ops.flash_eqlinear.group_layer_norm_fwd(x, w, b, 1e-6, torch.bfloat16)
    x64 = x.double()
    assert rel_l2(mean, x64.mean(-1)) < 1e-6
    assert rel_l2(rstd, torch.rsqrt(x64.var(-1, unbiased=False) + 1e-6)) < 1e-6


def test_reproducible():
    x, w, b = inputs(5000, 192, torch.float32)
    gy = torch.randn(5000, 768, device=DEV).to(torch.bfloat16)
    outs = []
    for _ in range(2):
        ins = [t.detach().clone().requires_grad_() for t in (x, w, b)]
        y = group_layer_norm(*ins, out_dtype=torch.bfloat16)
        y.backward(gy)
        outs.append([y] + [t.grad for t in ins])
    for a, b_ in zip(*outs, strict=True):
        assert torch.equal(a, b_)


def test_views_and_leading_dims():
    """A misaligned, non-contiguous x with leading dimensions: as its contiguous copy."""
    base = torch.randn(2, 9, 4 * 48 + 1, device=DEV)
    x = base[..., 1:]  # 4-byte offset rows: not 16-byte aligned, not contiguous
    w, b = torch.randn(48, device=DEV, requires_grad=True), torch.randn(48, device=DEV)
    assert fused_layer_norm_applies(x, w, 4, None)  # (w's gradient)
    assert torch.equal(group_layer_norm(x, w, b), group_layer_norm(x.contiguous(), w, b))


def test_inference_without_casts_runs_stock_ops():
    """No gradient and no cast to save: F.layer_norm as it is (one kernel either way)."""
    x, w, b = inputs(64, 32, torch.float16)
    assert not fused_layer_norm_applies(x, w, 4, None)
    assert fused_layer_norm_applies(x.float(), w, 4, torch.float16)
    with torch.autocast("cuda", dtype=torch.float16):
        assert fused_layer_norm_applies(x, w, 4, torch.float16)  # autocast would upcast x and cast back
        assert not fused_layer_norm_applies(x.float(), w, 4, None)


@pytest.mark.parametrize("autocast_output", [False, True])
def test_training_node_is_cpp(autocast_output):
    """A training call's node is the C++ one (no Python in its bookkeeping nor in its backward), with the
    gradients of the stock path."""
    norm = GroupLayerNorm(256, autocast_output=autocast_output).to(DEV)
    x = torch.randn(4, 33, 256, device=DEV, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = norm(x)
    assert y.dtype == (torch.bfloat16 if autocast_output else torch.float32)
    node = y.grad_fn
    while node.name() == "ViewBackward0":  # (y as x's shape)
        node = node.next_functions[0][0]
    assert "GroupLayerNormFunction" in node.name(), node.name()
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, norm.weight, norm.bias), g)
    xs = x.detach().double().requires_grad_()
    ws, bs = (t.detach().double().requires_grad_() for t in (norm.weight, norm.bias))
    want = torch.autograd.grad(stock(xs, ws, bs, torch.float64), (xs, ws, bs), g.double())
    for a, w in zip(got, want, strict=True):
        assert a.dtype == torch.float32 and rel_l2(a, w) < 1e-2, rel_l2(a, w)


def test_opcheck():
    op = torch.ops.flash_eqlinear.group_layer_norm_fwd
    x, w, b = inputs(37, 24, torch.float32)
    torch.library.opcheck(op, (x, w, b, 1e-5, torch.bfloat16))
    torch.library.opcheck(op, (x.half(), w, b, 1e-5, torch.float16))
    leaves = tuple(t.detach().clone().requires_grad_() for t in (x, w, b))
    torch.library.opcheck(op, (*leaves, 1e-5, torch.float32))
    _, mean, rstd = op(x, w, b, 1e-5, torch.float32)
    bwd = torch.ops.flash_eqlinear.group_layer_norm_bwd
    torch.library.opcheck(bwd, (torch.randn_like(x).bfloat16(), x, w, mean, rstd, True, True))
    torch.library.opcheck(bwd, (torch.randn_like(x), x, w, mean, rstd, False, True))


def test_double_backward():
    x, w, b = inputs(64, 16, torch.float32)
    results = []
    for fused in (True, False):
        ins = [t.detach().clone().requires_grad_() for t in (x, w, b)]
        y = group_layer_norm(*ins) if fused else stock(*ins, torch.float32)
        gx, gw = torch.autograd.grad((y * y.detach().sin()).sum(), ins[:2], create_graph=True)
        second = torch.autograd.grad(gx.square().sum() + gw.square().sum(), ins[:2])  # b: unused
        results.append((gx, gw, *second))
    for a, b_ in zip(*results, strict=True):
        assert rel_l2(a, b_) < 1e-4


def test_module_under_autocast():
    """GroupLayerNorm(autocast_output=True) hands a linear layer the autocast dtype: F.layer_norm's output
    rounded once; without the flag, float32 as F.layer_norm; gradients as the stock path's."""
    torch.manual_seed(0)
    norm = GroupLayerNorm(768, autocast_output=True).to(DEV)
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    x = torch.randn(4, 197, 768, device=DEV, requires_grad=True)
    lin = torch.nn.Linear(768, 64).to(DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fused_layer_norm_applies(x, norm.weight, 4, torch.bfloat16)
        y = norm(x)
        want = stock(x.detach(), norm.weight.detach(), norm.bias.detach(), torch.bfloat16)
        assert y.dtype == torch.bfloat16
        assert (y != want).float().mean() < 1e-3 and rel_l2(y, want) < 1e-3
        lin(y).float().square().sum().backward()
        norm.autocast_output = False
        assert norm(x).dtype == torch.float32
    gx, gw = x.grad.clone(), norm.weight.grad.clone()
    x.grad = norm.weight.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lin(stock(x, norm.weight, norm.bias, torch.float32)).float().square().sum().backward()
    assert rel_l2(gx, x.grad) < 1e-2 and rel_l2(gw, norm.weight.grad) < 1e-2


def test_module_with_16bit_input_under_autocast():
    """A bf16 x (the residual stream of a model under autocast): F.layer_norm computes in float32 and returns
    float32; with autocast_output the fused op writes bf16 straight from bf16, else the stock ops run."""
    norm = GroupLayerNorm(384, autocast_output=True).to(DEV)
    x = torch.randn(2, 50, 384, device=DEV).bfloat16().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fused_layer_norm_applies(x, norm.weight, 4, torch.bfloat16)
        assert not fused_layer_norm_applies(x, norm.weight, 4, None)
        y = norm(x)
        want = stock(x.detach().float(), norm.weight.detach(), norm.bias.detach(), torch.bfloat16)
        assert y.dtype == torch.bfloat16 and rel_l2(y, want) < 1e-3
        y.float().sum().backward()
        assert x.grad.dtype == torch.bfloat16
        norm.autocast_output = False
        assert norm(x).dtype == torch.float32


def test_compiled_module_matches_eager():
    norm = GroupLayerNorm(256, autocast_output=True).to(DEV)
    x = torch.randn(3, 50, 256, device=DEV)
    compiled = torch.compile(norm, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = norm(x), compiled(x)
    assert a.dtype == b.dtype == torch.bfloat16
    assert rel_l2(a, b) < 1e-2


def test_falls_back_and_rejects():
    # c > 512: stock ops, the same function
    x, w, b = inputs(8, 600, torch.float32)
    assert not fused_layer_norm_applies(x, w, 4, None)
    assert rel_l2(group_layer_norm(x, w, b), stock(x, w, b, torch.float32)) < 1e-6
    op = torch.ops.flash_eqlinear.group_layer_norm_fwd
    with pytest.raises(RuntimeError, match="at most 512 fields"):
        op(x, w, b, 1e-5, torch.float32)
    x, w, b = inputs(8, 16, torch.float16)
    with pytest.raises(RuntimeError, match="out_dtype"):
        op(x, w, b, 1e-5, torch.bfloat16)
    with pytest.raises(RuntimeError, match="weight must have shape"):
        op(x, w[:-1], b, 1e-5, torch.float16)
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        op(x.cpu(), w, b, 1e-5, torch.float16)
    with pytest.raises(ValueError, match="shape"):
        group_layer_norm(x, w[:-1], b[:-1])
