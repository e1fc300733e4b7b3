"""flash_eq_linear_chunks on CUDA: a layer's output as three tensors of their own (an attention's q, k, v).

The ops (eq_linear_fwd_split3 / eq_linear_bwd_split3): the three parts are the whole output's column blocks,
bitwise (the same kernel computes the same tiles and writes each into its part), and the backward from three
part gradients equals the backward from their concatenation, bitwise (the Hopper kernels read each part where
it is; elsewhere the parts are copied out / joined), on every kernel path. The functional form, in training
(where the Hopper kernels take the parts, the ops; elsewhere views of the whole output): the same values and
gradients as the whole layer, with the fused and the GEMM-form weight gradient and an FP32 input under
autocast; on Hopper GPUs neither direction copies. The models' attention, eager and compiled.
"""

from __future__ import annotations

import pytest
import torch
from conftest import debug_env, rel_l2, require_cuda_kernels

import flash_eqlinear as fe
from flash_eqlinear import reference
from flash_eqlinear.models.layers import Attention, Variant

require_cuda_kernels()

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HOPPER = torch.cuda.get_device_capability()[0] == 9
# (M, c, d), d % 3 == 0. d / 3 a multiple of 64: the Hopper kernels take the parts (ViT-B's qkv; ViT-L's,
# whose forward runs in clusters of two; d / 3 = 64; swapped weight-gradient roles at c = 768, d = 192).
# d / 3 = 48: the weight gradient takes the parts, the forward and grad_x do not (joined / copied); odd and
# narrow layers: the portable kernels. An empty input.
SHAPES = [(1000, 192, 576), (777, 256, 768), (300, 64, 192), (500, 768, 192), (129, 48, 144), (257, 59, 9)]
SHAPES += [(7, 3, 3), (0, 32, 96)]


def make(M, c, d, dtype, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, 4 * c, device=DEV, generator=g).to(dtype)
    w = (torch.randn(4, d, c, device=DEV, generator=g) / (4 * c) ** 0.5).to(dtype)
    b = torch.randn(d, device=DEV, generator=g).to(dtype)
    return x, w, b


def part_grads(M, d, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(M, 4 * d // 3, device=DEV, generator=g) for _ in range(3)]


def grads(fn, x, w, b, gs, autocast=None):
    """The layer's output parts and its gradients for upstream gradients gs (one per part)."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
        parts = fn(*leaves)
    torch.autograd.backward(parts, [g.to(p.dtype) for p, g in zip(parts, gs, strict=True)])
    return [p.detach() for p in parts], [t.grad for t in leaves]


def chunked(x, w, b):
    return fe.flash_eq_linear_chunks(x, w, b, 3)


def whole(x, w, b):
    return fe.flash_eq_linear(x, w, b).chunk(3, -1)


@pytest.mark.parametrize("sm90", ["1", "0"], ids=["sm90", "portable"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, d", SHAPES)
def test_ops_equal_the_whole_layer(M, c, d, dtype, sm90, monkeypatch):
    # The ops themselves, on each path (FLASH_EQLINEAR_SM90=0: the portable kernels, parts copied / joined).
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", sm90)
    x, w, b = make(M, c, d, dtype)
    ops = torch.ops.flash_eqlinear
    parts = ops.eq_linear_fwd_split3(x, w, b)[:3]
    y = ops.eq_linear_fwd(x, w, b)
    assert all(p.is_contiguous() and p.shape == (M, 4 * d // 3) for p in parts)
    assert torch.equal(torch.cat(parts, 1), y)
    if M:
        y64 = reference.naive_eq_linear(x.double(), fe.planes_to_naive(w.double()), b.double(), 4)
        assert rel_l2(y, y64) <= {torch.float32: 1e-5}.get(dtype, 2e-2)
    gs = [g.to(dtype) for g in part_grads(M, d)]
    got = ops.eq_linear_bwd_split3(*gs, x, w, True, True, True)
    want = ops.eq_linear_bwd(torch.cat(gs, 1), x, w, True, True, True)
    for a, e in zip(got, want, strict=True):
        assert torch.equal(a, e)
    got = ops.eq_linear_bwd_split3(*gs, x, w, True, False, False, True)[0]  # an FP32 grad_x
    assert got.dtype == torch.float32 and torch.equal(
        got, ops.eq_linear_bwd(torch.cat(gs, 1), x, w, True, False, False, True)[0]
    )


@pytest.mark.parametrize("weight_grad", ["auto", "gemm"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, c, d", SHAPES)
def test_backward_from_parts_equals_whole(M, c, d, dtype, weight_grad, monkeypatch):
    debug_env(monkeypatch, weight_grad=weight_grad)
    x, w, b = make(M, c, d, dtype, seed=2)
    gs = part_grads(M, d)
    parts, got = grads(chunked, x, w, b, gs)
    ys, want = grads(whole, x, w, b, gs)
    assert all(torch.equal(p, q) for p, q in zip(parts, ys, strict=True))
    for a, e in zip(got, want, strict=True):
        assert torch.equal(a, e)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M, c, d", SHAPES[:5])
def test_fp32_input_under_autocast(M, c, d, dtype):
    # An FP32 x that needs its gradient: rounded in the op, grad_x in FP32 from the kernel, as whole.
    x, w, b = make(M, c, d, torch.float32, seed=3)
    gs = part_grads(M, d, seed=4)
    parts, got = grads(chunked, x, w, b, gs, autocast=dtype)
    ys, want = grads(whole, x, w, b, gs, autocast=dtype)
    assert parts[0].dtype == dtype and got[0].dtype == torch.float32
    assert all(torch.equal(p, q) for p, q in zip(parts, ys, strict=True))
    for a, e in zip(got, want, strict=True):
        assert torch.equal(a, e)


@pytest.mark.parametrize("swap", ["0", "1"])
def test_each_weight_gradient_role(swap, monkeypatch):
    # The Hopper weight gradient with grad_y as either operand (FLASH_EQLINEAR_DEBUG=wgrad_swap=0|1).
    debug_env(monkeypatch, wgrad_swap=swap)
    x, w, b = make(1000, 192, 576, torch.bfloat16, seed=5)
    gs = part_grads(1000, 576, seed=6)
    parts, got = grads(chunked, x, w, b, gs)
    ys, want = grads(whole, x, w, b, gs)
    assert all(torch.equal(p, q) for p, q in zip(parts, ys, strict=True))
    for a, e in zip(got, want, strict=True):
        assert torch.equal(a, e)


def cuda_kernels(fn):
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[cuda]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.skipif(not HOPPER, reason="the Hopper kernels take the parts in place (sm_90)")
def test_no_copies_on_hopper():
    x, w, b = make(2000, 192, 576, torch.bfloat16, seed=7)
    w.requires_grad_()
    b.requires_grad_()
    fwd = cuda_kernels(lambda: fe.flash_eq_linear_chunks(x, w, b, 3))
    assert len(fwd) == 1 and "eq_linear_fwd_sm90" in fwd[0], fwd
    gs = [g.to(torch.bfloat16) for g in part_grads(2000, 576)]
    xr = x.detach().clone().requires_grad_()
    parts = fe.flash_eq_linear_chunks(xr, w, b, 3)
    bwd = cuda_kernels(lambda: torch.autograd.backward(parts, gs))
    assert not [k for k in bwd if "cat" in k.lower() or "copy" in k.lower()], bwd
    assert sum("eq_bwd_weight_sm90" in k for k in bwd) == 1, bwd
    assert sum("eq_linear_fwd_sm90" in k for k in bwd) == 1, bwd


def test_opcheck():
    x, w, b = make(37, 64, 192, torch.bfloat16)
    op = torch.ops.flash_eqlinear.eq_linear_fwd_split3.default
    torch.library.opcheck(op, (x, w, b))
    torch.library.opcheck(op, (x, w, None))
    torch.library.opcheck(op, (x.float(), w, b))  # the FP32 input, rounded in the op
    torch.library.opcheck(op, tuple(t.detach().clone().requires_grad_() for t in (x, w, b)))
    gs = [g.to(torch.bfloat16) for g in part_grads(37, 192)]
    bwd = torch.ops.flash_eqlinear.eq_linear_bwd_split3.default
    torch.library.opcheck(bwd, (*gs, x, w, True, True, True, False))
    torch.library.opcheck(bwd, (*gs, x, w, True, False, True, True))


def test_misuse_raises():
    x, w, b = make(8, 16, 48, torch.float16)
    with pytest.raises(ValueError, match="chunks"):
        fe.flash_eq_linear_chunks(x, w, b, 5)
    with pytest.raises(RuntimeError, match="three parts"):
        torch.ops.flash_eqlinear.eq_linear_fwd_split3(x, w[:, :-1], b[:-1])
    gs = [torch.zeros(8, 64, device=DEV, dtype=torch.float16) for _ in range(3)]
    with pytest.raises(RuntimeError, match="grad_y parts"):
        torch.ops.flash_eqlinear.eq_linear_bwd_split3(gs[0], gs[1], gs[2][:, :-4], x, w, True, True, True)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.flash_eqlinear.eq_linear_bwd_split3(gs[0], gs[1], gs[2].float(), x, w, True, True, True)


@pytest.mark.parametrize("windows", [False, True], ids=["tokens", "windows"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_attention_takes_the_parts(compile, windows):
    # The models' attention takes qkv's parts (FlashEQLinear.forward_chunks): the same outputs and gradients
    # as from the whole output (the module called as a plain layer), eager and compiled as one graph; tokens
    # (B, N, C) and windows (B, W, N, C) with an additive mask (Swin).
    torch.manual_seed(0)
    attn = Attention(Variant("flash"), 256, 4).to(DEV)
    x = torch.randn(2, 3, 49, 256, device=DEV) if windows else torch.randn(2, 50, 256, device=DEV)
    mask = torch.randn(1, 3 * 4, 49, 49, device=DEV) if windows else None

    def run(module, chunks: bool):
        if not chunks:
            module.qkv.forward_chunks = None  # an instance attribute: Attention then calls qkv whole
        xr = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = (torch.compile(module, fullgraph=True) if compile else module)(xr, mask)
        y.float().square().sum().backward()
        out = [y.detach(), xr.grad] + [p.grad.clone() for p in module.parameters()]
        module.zero_grad()
        if not chunks:
            del module.qkv.forward_chunks
        return out

    got, want = run(attn, True), run(attn, False)
    for a, e in zip(got, want, strict=True):
        assert rel_l2(a, e) <= 1e-6 if compile else torch.equal(a, e)


def test_chunks_follow_the_layer_under_autocast_inference():
    lin = fe.FlashEQLinear(128, 384).to(DEV).eval()
    x = torch.randn(3, 10, 128, device=DEV)
    with torch.no_grad():
        with torch.autocast("cuda", dtype=torch.float16):
            parts, y = lin.forward_chunks(x, 3), lin(x)
        y32 = lin(x)
    assert all(p.dtype == torch.float16 and p.shape == (3, 10, 128) for p in parts)
    assert torch.equal(torch.cat(parts, -1), y)
    assert rel_l2(y, y32) <= 2.0**-9
