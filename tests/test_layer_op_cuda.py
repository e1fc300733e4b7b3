"""The layer op ``flash_eqlinear::eq_linear`` (autograd and autocast in C++) and the plan behind it.

What it checks: a module call is one dispatcher call with a C++ autograd node; the eager op and the traced
2-D ops give the same outputs and gradients bit for bit (plain, FP32 x rounded in the op, x's planes kept);
``opcheck`` of the op; in-place use of its output; the plan as a table (Hopper GPUs); ``explain``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import RefEQLinear, debug_env, rel_l2, require_cuda_kernels

import flash_eqlinear as fe
from flash_eqlinear import ops, reference
from flash_eqlinear.fourier import dft_basis

require_cuda_kernels()

DEV = "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HOPPER = torch.cuda.get_device_capability()[0] == 9


def top_level_ops(fn) -> list[str]:
    """Names of the dispatcher ops ``fn`` calls from Python (profiler events without a parent op)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [
        e.name
        for e in prof.events()
        if e.cpu_parent is None and (e.name.startswith("aten::") or e.name.startswith("flash_eqlinear::"))
    ]


@pytest.mark.parametrize("mode", ["inference fp16", "training bf16 autocast", "training fp32"])
def test_module_call_is_one_dispatcher_call(mode):
    dtype = torch.float16 if mode == "inference fp16" else torch.float32
    layer = fe.FlashEQLinear(256, 256, device=DEV, dtype=dtype)
    x = torch.randn(8, 64, 256, device=DEV, dtype=dtype, requires_grad=mode != "inference fp16")
    if mode == "inference fp16":
        layer.eval()
        with torch.no_grad():
            names = top_level_ops(lambda: layer(x))
    elif mode == "training bf16 autocast":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            names = top_level_ops(lambda: layer(x))
            y = layer(x)
        assert y.dtype == torch.bfloat16
    else:
        names = top_level_ops(lambda: layer(x))
        y = layer(x)
    assert names == ["flash_eqlinear::eq_linear"], names
    if mode != "inference fp16":
        assert "EqLinearFunction" in y.grad_fn.name(), y.grad_fn.name()  # the C++ node, not a Python one


def traced_path(x, w, b):
    """The 2-D ops with their Python autograd formulas (what torch.compile traces), eagerly."""
    return ops._eq_linear(*ops._autocast_and_check(x, w, b, 4))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "form, lead, c, d",
    [
        ("plain", (3, 43), 59, 48),
        ("plain", (257,), 64, 64),
        ("round_x", (5, 31), 64, 96),
        ("keep_planes", (300,), 512, 520),
    ],
)
def test_layer_op_equals_traced_ops(form, lead, c, d, dtype, monkeypatch):
    if form == "round_x" and dtype != torch.float32:
        pytest.skip("the FP32 input under 16-bit autocast")
    if form == "keep_planes" and dtype == torch.float32:
        pytest.skip("exact FP32 keeps x (x's planes: TF32 layers from c * d = 2^19 on Hopper GPUs)")
    if form == "keep_planes":
        debug_env(monkeypatch, weight_grad="gemm")
    g = torch.Generator(device=DEV).manual_seed(1)
    x = torch.randn(*lead, 4 * c, device=DEV, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(4, d, c, device=DEV, generator=g) / (4 * c) ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(d, device=DEV, generator=g).to(dtype).requires_grad_()
    gy = torch.randn(*lead, 4 * d, device=DEV, generator=g)
    cast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=form == "round_x")
    results = []
    for fn in (fe.flash_eq_linear, traced_path):
        with cast:
            y = fn(x, w, b)
            if form != "round_x":
                want = ops.plan(0, c, d, dtype, DEV, needs_x=True, needs_p=True, needs_b=True)["train"]
                assert want == form or (form == "plain" and want in ("plain", "keep_planes")), want
        grads = torch.autograd.grad(y, (x, w, b), gy.to(y.dtype))
        results.append((y, *grads))
    for got, want in zip(*results, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)
    # and against float64
    w64 = fe.planes_to_naive(w.double())
    ref = reference.naive_eq_linear(x.double(), w64, b.double(), 4)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[results[0][0].dtype]
    assert rel_l2(results[0][0], ref) < tol


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead", [(37,), (2, 5, 7)])
def test_layer_op_opcheck(lead, dtype):
    c, d = 16, 24
    x = torch.randn(*lead, 4 * c, device=DEV, dtype=dtype, requires_grad=True)
    w = (torch.randn(4, d, c, device=DEV) / 8).to(dtype).requires_grad_()
    b = torch.randn(d, device=DEV, dtype=dtype, requires_grad=True)
    op = torch.ops.flash_eqlinear.eq_linear.default
    torch.library.opcheck(op, (x, w, b))
    torch.library.opcheck(op, (x, w, None))


def test_output_allows_in_place_ops():
    layer = fe.FlashEQLinear(64, 96, device=DEV)
    x = torch.randn(3, 5, 64, device=DEV, requires_grad=True)
    y = layer(x)
    y.add_(1.0)  # a residual added in place, as models do
    y.square().sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_layer_op_errors():
    op = torch.ops.flash_eqlinear.eq_linear
    x = torch.randn(8, 64, device=DEV)
    w = torch.randn(4, 24, 16, device=DEV)
    b = torch.randn(24, device=DEV)
    with pytest.raises(ValueError, match="in_features"):
        op(x[:, :-4], w, b)
    with pytest.raises(RuntimeError, match="input dtype torch.float16 does not match weight dtype"):
        op(x.half(), w, b)
    with pytest.raises(ValueError, match=r"bias must have shape \(d,\) = \(24,\)"):
        op(x, w, b[:-1])
    with pytest.raises(ValueError, match="holds group size 3"):
        op(x, w[:3], b)
    with pytest.raises(TypeError, match="floating-point"):
        op(x.int(), w, b)
    with pytest.raises(RuntimeError, match="does not match"):  # an FP32 x needs 16-bit planes to be rounded
        op(x, w.double(), b.double(), True)
    # the module's messages, through the layer op
    layer = fe.FlashEQLinear(64, 96, device=DEV)
    with pytest.raises(ValueError, match="in_features = c\\*T = 16\\*4 = 64"):
        layer(torch.randn(2, 60, device=DEV))
    with pytest.raises(RuntimeError, match="does not match weight dtype"):
        layer(torch.randn(2, 64, device=DEV, dtype=torch.bfloat16))


def test_inference_mode_and_autocast_inference():
    layer = fe.FlashEQLinear(128, 128, device=DEV).eval()
    x = torch.randn(9, 128, device=DEV)
    with torch.inference_mode():
        y = layer(x)
    assert torch.equal(y, fe.flash_eq_linear(x, layer.weight.detach(), layer.bias.detach()))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        y16 = layer(x)  # the kept casts of the parameters (inference under autocast)
        again = torch.ops.flash_eqlinear.eq_linear(x, layer.weight, layer.bias)  # cast by the C++ kernel
    assert y16.dtype == again.dtype == torch.float16 and torch.equal(y16, again)


# ---- The plan as a table (H100-class devices; thresholds in csrc/eq_linear_plan.cpp) ----
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
PLAN_ROWS = [
    # (dtype, c, d, tf32, needs (x, p, b), x_fp32, chunks, debug switches, expected entries)
    (F16, 16, 16, False, (0, 0, 0), False, 0, {}, {"forward": "narrow", "train": "inference"}),
    (F16, 256, 256, False, (0, 0, 0), False, 0, {}, {"forward": "hopper", "fallback": "mma"}),
    (BF16, 1024, 1024, False, (0, 0, 0), False, 0, {}, {"forward": "hopper", "fallback": "gemm"}),
    (BF16, 1024, 1024, False, (0, 0, 0), False, 0, {"products": "gemm"}, {"forward": "gemm"}),
    (F16, 256, 256, False, (0, 0, 0), False, 0, {"products": "fused"}, {"forward": "hopper"}),
    (F32, 256, 256, False, (0, 0, 0), False, 0, {}, {"forward": "exact_fp32"}),
    (F32, 32, 64, False, (0, 0, 0), False, 0, {}, {"forward": "narrow"}),
    (F32, 256, 256, True, (0, 0, 0), False, 0, {}, {"forward": "tf32_hopper", "fallback": "tf32_gemm"}),
    (F32, 1024, 1024, True, (0, 0, 0), False, 0, {}, {"forward": "tf32_gemm"}),
    (BF16, 256, 256, False, (1, 1, 1), False, 0, {}, {"train": "plain", "weight_grad": "fused"}),
    (BF16, 256, 256, False, (0, 1, 0), False, 0, {}, {"weight_grad_kernel": "hopper"}),
    (F16, 255, 256, False, (0, 1, 0), False, 0, {}, {"weight_grad_kernel": "mma"}),  # (c odd)
    (F32, 256, 256, False, (0, 1, 0), False, 0, {}, {"weight_grad_kernel": "fp32"}),
    (BF16, 512, 512, False, (1, 1, 1), False, 0, {}, {"train": "keep_planes", "weight_grad": "gemm"}),
    (BF16, 512, 512, False, (1, 1, 1), False, 0, {"keep_planes": "0"}, {"train": "plain"}),
    (BF16, 512, 512, False, (1, 1, 1), False, 0, {}, {"grad_x": "hopper_planes"}),
    (BF16, 2048, 2048, False, (1, 1, 1), False, 0, {}, {"weight_grad": "gemm", "grad_x": "gemm"}),
    (BF16, 256, 1024, False, (1, 1, 1), False, 0, {}, {"weight_grad": "fused", "grad_x": "kernel"}),
    (BF16, 192, 768, False, (1, 1, 1), False, 0, {}, {"weight_grad": "fused"}),
    (BF16, 60, 64, False, (1, 0, 0), True, 0, {}, {"train": "round_x", "grad_x": "kernel"}),
    (BF16, 64, 192, False, (1, 1, 1), False, 3, {"keep_planes": "0"}, {"train": "parts"}),
    (BF16, 64, 96, False, (1, 1, 1), False, 3, {"keep_planes": "0"}, {"train": "plain"}),
    (F32, 512, 512, False, (1, 1, 1), False, 0, {}, {"weight_grad": "fused", "train": "plain"}),
    (F32, 1024, 1024, False, (1, 1, 1), False, 0, {}, {"weight_grad": "gemm", "train": "plain"}),
    (F32, 1024, 1024, True, (1, 1, 1), False, 0, {}, {"weight_grad": "gemm", "train": "keep_planes"}),
    (F16, 512, 512, False, (1, 1, 1), False, 0, {"weight_grad": "fused"}, {"weight_grad": "fused"}),
]


@pytest.mark.skipif(not HOPPER, reason="the table's rows are the choices on Hopper GPUs")
@pytest.mark.parametrize("row", PLAN_ROWS, ids=lambda r: f"{r[0]}-{r[1]}x{r[2]}-{r[4]}-{r[7]}")
def test_plan_table(row, monkeypatch):
    dtype, c, d, tf32, (nx, np_, nb), x_fp32, chunks, switches, want = row
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "1")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    if switches:
        debug_env(monkeypatch, **switches)
    needs = {"needs_x": bool(nx), "needs_p": bool(np_), "needs_b": bool(nb)}
    got = ops.plan(1024, c, d, dtype, DEV, **needs, x_fp32=x_fp32, chunks=chunks)
    assert {k: got[k] for k in want} == want, got


def test_plan_without_hopper_kernels(monkeypatch):
    monkeypatch.setenv("FLASH_EQLINEAR_SM90", "0")
    assert ops.plan(0, 256, 256, F16, DEV)["forward"] == "mma"
    assert ops.plan(0, 1024, 1024, F16, DEV)["forward"] == "gemm"
    p = ops.plan(0, 2048, 2048, BF16, DEV, needs_x=True, needs_p=True)
    assert (p["weight_grad"], p["grad_x"], p["train"]) == ("gemm", "gemm", "keep_planes")
    assert ops.plan(0, 256, 256, BF16, DEV, needs_p=True)["weight_grad_kernel"] == "mma"


def test_plan_rejects_unknown_debug_switch(monkeypatch):
    debug_env(monkeypatch, narow="0")
    with pytest.raises(Exception, match="FLASH_EQLINEAR_DEBUG"):
        ops.plan(0, 64, 64, F16, DEV)


def test_explain_follows_the_call():
    layer = fe.FlashEQLinear(256, 256, device=DEV)
    x = torch.randn(4, 256, device=DEV, requires_grad=True)
    p = fe.explain(layer, x)
    assert p["backend"] == "cuda" and p["train"] in ("plain", "keep_planes") and p["why"]
    with torch.no_grad():
        assert fe.explain(layer, x)["train"] == "inference"
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert fe.explain(layer, x)["train"] in ("round_x", "keep_planes")
    assert fe.explain(layer, x.detach().double())["backend"] == "reference"


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [192, 96])
def test_chunks_op_equals_traced_ops(d, x_dtype):
    # eq_linear_chunks (its C++ node) against the traced path's split3 / fwd ops: the same parts and
    # gradients bit for bit; with d % 192 == 0 on Hopper GPUs, three tensors of their own.
    c, lead = 64, (5, 33)
    g = torch.Generator(device=DEV).manual_seed(2)
    x = torch.randn(*lead, 4 * c, device=DEV, generator=g).to(x_dtype).requires_grad_()
    w = (torch.randn(4, d, c, device=DEV, generator=g) / 16).bfloat16().requires_grad_()
    b = torch.randn(d, device=DEV, generator=g).bfloat16().requires_grad_()
    gs = [torch.randn(*lead, 4 * d // 3, device=DEV, generator=g).bfloat16() for _ in range(3)]
    results = []
    for fn in (
        lambda: fe.flash_eq_linear_chunks(x, w, b, 3),
        lambda: ops._eq_linear(*ops._autocast_and_check(x, w, b, 4), chunks=3),
    ):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            parts = fn()
        grads = torch.autograd.grad(parts, (x, w, b), gs)
        results.append((*parts, *grads))
        if HOPPER and d % 192 == 0:
            assert len({p.untyped_storage().data_ptr() for p in parts}) == 3
    for got, want in zip(*results, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


# ---- SwappedEQLinear: the fused kernels on a naive layer's own parameters ----


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("layout", ["naive", "reference"])
@pytest.mark.parametrize("c, d", [(48, 39), (192, 576)])
def test_swapped_layer_trains_as_the_naive_one(c, d, layout, autocast):
    torch.manual_seed(0)
    naive = (fe.NaiveEQLinear(4 * c, 4 * d) if layout == "naive" else RefEQLinear(4 * c, 4 * d)).to(DEV)
    swapped = fe.SwappedEQLinear(naive)
    params = list(naive.parameters())
    assert len(list(swapped.parameters())) == len(params)
    assert all(a is b for a, b in zip(swapped.parameters(), params, strict=True))
    x = torch.randn(3, 37, 4 * c, device=DEV, requires_grad=True)
    g = torch.randn(3, 37, 4 * d, device=DEV)
    grads = []
    for call in (naive, swapped, lambda x: torch.cat(swapped.forward_chunks(x, 3), -1)):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = call(x)
        grads.append((y.float(), *torch.autograd.grad(y, (x, *params), g.to(y.dtype))))
    tol = 2e-2 if autocast else 1e-5
    for got in grads[1:]:
        for a, b in zip(grads[0], got, strict=True):
            assert a.shape == b.shape and b.dtype == a.dtype and rel_l2(b, a) < tol, rel_l2(b, a)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        # the planes made inside the layer's one op (no casts or stock products from Python); q, k, v too
        assert top_level_ops(lambda: swapped(x)) == ["flash_eqlinear::eq_linear_group"]
        names = top_level_ops(lambda: swapped.forward_chunks(x, 3))
        assert names[0] == "flash_eqlinear::eq_linear_group" and set(names[1:]) <= {
            "aten::chunk",
            "aten::split",
        }
    swapped.eval()
    with torch.no_grad():
        y0 = swapped(x)
        assert top_level_ops(lambda: swapped(x)) == ["flash_eqlinear::eq_linear"]  # planes kept
        assert torch.equal(swapped(x), y0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eq_linear_group_op(dtype):
    """The layer on a group-domain weight: against float64 (the planes made in FP32 and rounded once to
    the dtype the layer runs in, autocast's included), chunks, opcheck, errors."""
    torch.manual_seed(0)
    c, d, T = 24, 42, 4
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    Q = dft_basis(T, work, torch.device(DEV))
    w = torch.randn(d, 1, c, T, device=DEV, dtype=dtype, requires_grad=True)
    b = torch.randn(d, 1, device=DEV, dtype=dtype, requires_grad=True)
    x = torch.randn(5, 7, T * c, device=DEV, dtype=dtype, requires_grad=True)
    gy = torch.randn(5, 7, T * d, device=DEV, dtype=dtype)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = reference.naive_eq_linear(x64, w64.view(d, c, T), b64.view(d), T)
    want = (y64, *torch.autograd.grad(y64, (x64, w64, b64), gy.double()))
    tol = {torch.float32: 1e-5}.get(dtype, 1e-2)
    for chunks in (None, 3):
        y = torch.cat(ops._GROUP_OP(x, w, b, Q, None, chunks), -1)
        got = (y, *torch.autograd.grad(y, (x, w, b), gy))
        for a, e in zip(got, want, strict=True):
            assert a.dtype == dtype and a.shape == e.shape and rel_l2(a, e) < tol, (chunks, rel_l2(a, e))
    if dtype == torch.float32:  # under autocast: bf16 out, FP32 gradients of the FP32 parameters and x
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ya = ops._GROUP_OP(x, w, b, Q)[0]
        ga = torch.autograd.grad(ya, (x, w, b), gy.bfloat16())
        assert ya.dtype == torch.bfloat16 and all(t.dtype == torch.float32 for t in ga)
        assert rel_l2(ya, y64) < 1e-2 and all(rel_l2(a, e) < 2e-2 for a, e in zip(ga, want[1:], strict=True))
    args = (x.detach().requires_grad_(), w.detach().requires_grad_(), b.detach().requires_grad_(), Q)
    torch.library.opcheck(ops._GROUP_OP, args)
    torch.library.opcheck(ops._GROUP_OP, (*args, None, 3))
    with pytest.raises(ValueError, match=r"weight must have shape \(d, c, T\) or \(d, 1, c, T\)"):
        ops._GROUP_OP(x, w.detach()[..., :3], b, Q)
    with pytest.raises(ValueError, match=r"input's last dimension must be in_features"):
        ops._GROUP_OP(x[..., 1:], w, b, Q)
    with pytest.raises(ValueError, match=r"chunks must be a positive divisor of d"):
        ops._GROUP_OP(x, w, b, Q, None, 4)


@pytest.mark.parametrize("T", [2, 4, 8, 5, 17])
@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=str)
@pytest.mark.parametrize("out", [None, torch.bfloat16], ids=["own dtype", "to bf16"])
def test_group_planes_op(T, dtype, out):
    """The eager transform of SwappedEQLinear (the kernel for T <= 16, stock ops beyond and for float64):
    the planes, in the weight's dtype or another, and the weight's gradient against float64, the product
    outside autocast (one rounding of 16-bit outputs), opcheck, a clear error."""
    torch.manual_seed(0)
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    Q = dft_basis(T, work, torch.device(DEV))
    w = torch.randn(40, 1, 24, T, device=DEV, dtype=dtype, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.float16):
        p = ops._PLANES_OP(w, Q, out)
    gp = torch.randn(T, 40, 24, device=DEV, dtype=p.dtype)
    (gw,) = torch.autograd.grad(p, w, gp)
    Q64 = Q.double()
    want = (Q64 @ w.detach().double().reshape(-1, T).t()).view(T, 40, 24)
    want_gw = (gp.double().reshape(T, -1).t() @ Q64).view(w.shape)
    eps = {torch.float64: 1e-15, torch.float32: 1e-6}
    assert p.dtype == (out or dtype) and gw.dtype == dtype and p.is_contiguous() and gw.shape == w.shape
    assert rel_l2(p, want) < eps.get(p.dtype, torch.finfo(p.dtype).eps), rel_l2(p, want)
    assert rel_l2(gw, want_gw) < eps.get(dtype, torch.finfo(dtype).eps), rel_l2(gw, want_gw)
    torch.library.opcheck(ops._PLANES_OP, (w.detach().view(40, 24, T).requires_grad_(), Q, out))
    with pytest.raises(ValueError, match=r"weight must have shape \(d, c, T\) or \(d, 1, c, T\)"):
        ops._PLANES_OP(w.detach().view(40, 24, T)[..., :1], Q)
