"""An FP32 input under fp16 / bf16 autocast in training (eq_linear_fwd_cast): x rounded inside the op,
grad_x written in FP32 by the kernel instead of a 16-bit grad_x widened by the cast's backward.

The same function as casting first (``FLASH_EQLINEAR_DEBUG=fused_cast=0``): the output and the weight
gradients bit for bit, grad_x equal to the cast-first grad_x before its rounding to 16 bits (so
rounding it gives that one bit for bit) and no further from float64; the backward's 16-bit -> FP32
copy is gone (profiler); opcheck, torch.compile, double backward, misuse.
"""

from __future__ import annotations

import pytest
import torch
from conftest import debug_env, rel_l2, require_cuda_kernels

import flash_eqlinear as fe
from flash_eqlinear import reference

require_cuda_kernels()

DEV = "cuda"
LOW = [torch.float16, torch.bfloat16]
# (M, c, d): Hopper-kernel layers (a ViT-B qkv-like one; d = 512: the forward in clusters of two; c = 512:
# grad_x in clusters of two), an odd c (the mma.sync kernel's FP32 epilogue), a narrow layer (its own
# kernel, widened), an empty input
SHAPES = [(1000, 192, 576), (300, 64, 512), (300, 512, 64), (129, 48, 40), (257, 59, 48), (7, 3, 5)]
SHAPES += [(0, 16, 16)]


def make(M, c, d, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, 4 * c, device=DEV, generator=g)
    planes = torch.randn(4, d, c, device=DEV, generator=g) / (4 * c) ** 0.5
    b = torch.randn(d, device=DEV, generator=g)
    gy = torch.randn(M, 4 * d, device=DEV, generator=g)
    return x, planes, b, gy


def run(x, planes, b, gy, dtype, fused_cast, monkeypatch):
    """(y, grad_x, grad_planes, grad_bias) of flash_eq_linear under autocast to dtype, FP32 leaves."""
    debug_env(monkeypatch, fused_cast="1" if fused_cast else "0")
    leaves = [t.detach().clone().requires_grad_() for t in (x, planes, b)]
    with torch.autocast("cuda", dtype=dtype):
        y = fe.flash_eq_linear(*leaves)
    y.backward(gy.to(dtype))
    return (y, *(t.grad for t in leaves))


@pytest.mark.parametrize("mode", ["fused", "gemm"])
@pytest.mark.parametrize("sm90", [True, False], ids=["sm90", "portable"])
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("M, c, d", SHAPES)
def test_same_function_as_casting_first(M, c, d, dtype, sm90, mode, monkeypatch):
    debug_env(monkeypatch, weight_grad=mode)
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1" if sm90 else "0")
    x, planes, b, gy = make(M, c, d, seed=M + c + d)
    y, gx, gp, gb = run(x, planes, b, gy, dtype, True, monkeypatch)
    y0, gx0, gp0, gb0 = run(x, planes, b, gy, dtype, False, monkeypatch)
    assert y.dtype == y0.dtype == dtype and torch.equal(y, y0)
    assert gp.dtype == gb.dtype == torch.float32 and torch.equal(gp, gp0) and torch.equal(gb, gb0)
    assert gx.dtype == gx0.dtype == torch.float32
    assert torch.equal(gx.to(dtype).float(), gx0), rel_l2(gx, gx0)  # the same grad_x before its rounding
    # ... written unrounded by a kernel (Hopper, mma.sync), not rounded and widened: except for narrow
    # layers, and with the GEMM-form weight gradient (grad_x from the GEMM form, or x cast first)
    from_kernel = M > 0 and max(c, d) > 32 and mode == "fused"
    assert torch.equal(gx, gx0) != from_kernel
    if M:  # ... so no further from float64 than the rounded one
        x64 = x.to(dtype).double().requires_grad_()
        p64 = planes.to(dtype).double()
        reference.naive_eq_linear(x64, fe.planes_to_naive(p64), b.to(dtype).double(), 4).backward(
            gy.to(dtype).double()
        )
        assert rel_l2(gx, x64.grad) <= rel_l2(gx0, x64.grad) * 1.001 + 1e-12


def test_the_backward_copy_is_gone(monkeypatch):
    # ViT-B-like qkv layer on the default path: with the cast inside the op, the backward launches no
    # 16-bit -> FP32 copy (the cast-first backward does: the check can fail). Only x needs a gradient
    # (the weights' casts have copies in their backward either way).
    x, planes, b, gy = make(4096, 192, 576)

    def copies(fused_cast):
        debug_env(monkeypatch, fused_cast="1" if fused_cast else "0")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fe.flash_eq_linear(x.detach().clone().requires_grad_(), planes, b)
        g = gy.bfloat16()
        torch.cuda.synchronize()
        cuda = torch.profiler.ProfilerActivity.CUDA
        with torch.profiler.profile(activities=[cuda]) as prof:
            y.backward(g)
            torch.cuda.synchronize()
        names = [e.name.lower() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return [n for n in names if "copy" in n]

    assert copies(False), "the cast-first backward was expected to launch a copy kernel"
    assert not copies(True)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_cast_op_opcheck(dtype):
    x, planes, b, gy = make(37, 16, 24)
    op = torch.ops.flash_eqlinear.eq_linear_fwd_cast
    p, bb = planes.to(dtype), b.to(dtype)
    torch.library.opcheck(op.default, (x, p, bb))
    torch.library.opcheck(op.default, (x, p, None))
    torch.library.opcheck(op.default, (x.clone().requires_grad_(), p.clone().requires_grad_(), bb))
    bwd = torch.ops.flash_eqlinear.eq_linear_bwd.default
    torch.library.opcheck(bwd, (gy.to(dtype), x.to(dtype), p, True, True, True, True))
    torch.library.opcheck(bwd, (gy.to(dtype), x.to(dtype), p, False, True, True, True))
    y, x_low = op(x, p, bb)
    assert y.dtype == x_low.dtype == dtype and torch.equal(x_low, x.to(dtype))
    assert torch.equal(y, torch.ops.flash_eqlinear.eq_linear_fwd(x.to(dtype), p, bb))


def test_compiled_block_matches_eager(monkeypatch):
    # LayerNorm (FP32 under autocast) -> FlashEQLinear, forward + backward compiled as one graph. Eager
    # rounds x in eq_linear_fwd_cast (FLASH_EQLINEAR_DEBUG=fused_cast=1); the compiled graph casts first
    # whatever the switch says (Inductor fuses the cast into the LayerNorm) and calls eq_linear_fwd, as eager
    # does with the switch at 0, and matches that: the same function, up to Inductor's LayerNorm against
    # ATen's.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), fe.FlashEQLinear(256, 384)).to(DEV)
    compiled = torch.compile(model, fullgraph=True)
    x0 = torch.randn(300, 256, device=DEV)

    def run(m, fused_cast, op):
        debug_env(monkeypatch, fused_cast=fused_cast)
        xi = x0.clone().requires_grad_()
        cpu = torch.profiler.ProfilerActivity.CPU
        with torch.profiler.profile(activities=[cpu]) as prof, torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(xi)
        names = {e.name.split("::")[-1] for e in prof.events() if "flash_eqlinear" in e.name}
        assert op in names and not names & ({"eq_linear_fwd", "eq_linear_fwd_cast"} - {op}), names
        y.float().square().sum().backward()
        assert y.dtype == torch.bfloat16 and xi.grad.dtype == torch.float32
        return y, xi.grad

    run(model, "1", "eq_linear_fwd_cast")
    y_first, gx_first = run(model, "0", "eq_linear_fwd")
    y, gx = run(compiled, "1", "eq_linear_fwd")
    assert rel_l2(y, y_first) < 1e-3  # (bit for bit when measured; room for a rare last-bit flip)
    assert rel_l2(gx, gx_first) < 1e-5


def test_double_backward(monkeypatch):
    # create_graph=True takes the differentiable path; grad_x still comes back in FP32. A penalty on both
    # first-order gradients reaches x through the weight gradient too (through the saved rounded x): the
    # second-order gradients equal those of casting first, to bf16 rounding (the two terms reaching x add
    # in FP32 here, in bf16 there: 1.8e-3 seen). Without the term through the saved x, x's gradient would
    # miss the whole weight-gradient part of the penalty.
    x, planes, b, _ = make(65, 16, 24)

    def second_order(fused_cast):
        debug_env(monkeypatch, fused_cast="1" if fused_cast else "0")
        xs, ps = x.clone().requires_grad_(), planes.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fe.flash_eq_linear(xs, ps, b)
        gx, gp = torch.autograd.grad(y.float().square().sum(), (xs, ps), create_graph=True)
        assert gx.dtype == torch.float32
        (gx.square().sum() + gp.float().square().sum()).backward()
        return xs.grad, ps.grad

    got, want = second_order(True), second_order(False)
    for a, w in zip(got, want, strict=True):
        assert a.dtype == w.dtype == torch.float32 and rel_l2(a, w) < 1e-2, rel_l2(a, w)


def test_taken_only_where_it_applies(monkeypatch):
    # Inference, an x without grad, FP32 without autocast: the plain op, output as before.
    x, planes, b, _ = make(33, 16, 24)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fe.flash_eq_linear(x, planes, b).dtype == torch.bfloat16
        with torch.no_grad():
            assert fe.flash_eq_linear(x.requires_grad_(), planes, b).dtype == torch.bfloat16
    assert fe.flash_eq_linear(x, planes, b).dtype == torch.float32


def test_cast_op_misuse_raises():
    x, planes, b, _ = make(8, 16, 16)
    op = torch.ops.flash_eqlinear.eq_linear_fwd_cast
    with pytest.raises(RuntimeError, match="float32 x"):
        op(x.half(), planes.half(), None)
    with pytest.raises(RuntimeError, match="float32 x"):
        op(x, planes, None)
    with pytest.raises(RuntimeError, match="CUDA tensor"):
        op(x.cpu(), planes.half(), None)
    with pytest.raises(RuntimeError, match="features"):
        op(x[:, :-4], planes.half(), None)
    with pytest.raises(RuntimeError, match="bias"):
        op(x, planes.half(), b.half()[:-1])
    with torch.autocast("cuda", dtype=torch.bfloat16), pytest.raises(ValueError, match="in_features"):
        fe.flash_eq_linear(x[:, :-4].requires_grad_(), planes, b)
