"""flash_eq_linear off the fused kernels: the pure-PyTorch form chosen by size, both exact; and the module's
call structure on the fused path, checked on any machine (below)."""

import pytest
import torch
from conftest import GROUP_SIZES, loop_eq_linear, rel_l2
from torch.utils._python_dispatch import TorchDispatchMode

import flash_eqlinear as fe
from flash_eqlinear import modules, ops, reference
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


def test_form_with_dense_weight_kept():
    """Inference with the expanded weight kept: Fourier only from 256 rows."""
    assert reference_form(torch.empty(255, 1024), 4, 256, 256, dense_kept=True) == "dense"
    assert reference_form(torch.empty(2, 128, 1024), 4, 256, 256, dense_kept=True) == "fourier"
    assert reference_form(torch.empty(8, 1024), 4, 256, 256) == "fourier"
    assert reference_form(torch.empty(4096, 512), 4, 128, 128, dense_kept=True) == "dense"


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


@pytest.mark.parametrize("T", [2, 4, 5])
def test_mlp_is_the_composition(T, gen):
    # flash_eq_mlp = layer 2 (GELU (layer 1)), with gradients; off the kernels it composes the layers.
    c, h, d = 6, 24, 5
    x = torch.randn(3, 7, c * T, generator=gen, dtype=F64, requires_grad=True)
    w1, w2 = (torch.randn(T, n, k, generator=gen, dtype=F64, requires_grad=True) for n, k in ((h, c), (d, h)))
    b1, b2 = (torch.randn(n, generator=gen, dtype=F64, requires_grad=True) for n in (h, d))
    y = fe.flash_eq_mlp(x, w1, b1, w2, b2, T)
    want = reference.fourier_eq_linear(
        torch.nn.functional.gelu(reference.fourier_eq_linear(x, w1, b1, T)), w2, b2, T
    )
    assert y.shape == (3, 7, d * T) and rel_l2(y, want) < 1e-12
    g = torch.randn(y.shape, generator=gen, dtype=F64)
    got = torch.autograd.grad(y, (x, w1, b1, w2, b2), g)
    ref = torch.autograd.grad(want, (x, w1, b1, w2, b2), g)
    for a, r in zip(got, ref, strict=True):
        assert rel_l2(a, r) < 1e-12


@pytest.mark.parametrize("T, chunks", [(4, 3), (4, 2), (3, 3), (2, 1)])
def test_chunks_are_the_output_blocks(T, chunks, gen):
    # flash_eq_linear_chunks = the output's column blocks of whole fields, with gradients (off the kernels:
    # views of the whole output); d not a multiple of chunks is refused.
    c, d = 5, 6
    x = torch.randn(2, 3, c * T, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(T, d, c, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(d, generator=gen, dtype=F64, requires_grad=True)
    parts = fe.flash_eq_linear_chunks(x, w, b, chunks, T)
    want = fe.flash_eq_linear(x, w, b, T)
    assert len(parts) == chunks and torch.equal(torch.cat(parts, -1), want)
    assert all(p.shape == (2, 3, d * T // chunks) for p in parts)
    gs = [torch.randn(p.shape, generator=gen, dtype=F64) for p in parts]
    got = torch.autograd.grad(parts, (x, w, b), gs)
    ref = torch.autograd.grad(want, (x, w, b), torch.cat(gs, -1))
    for a, r in zip(got, ref, strict=True):
        assert rel_l2(a, r) < 1e-12
    lin = fe.FlashEQLinear(c * T, d * T, group_size=T).double()
    assert torch.equal(torch.cat(lin.forward_chunks(x, chunks), -1), lin(x))
    for bad in (4, 0, 2.0):
        with pytest.raises(ValueError, match="chunks"):
            fe.flash_eq_linear_chunks(x, w, b, bad, T)


def test_mlp_autocast_and_misuse():
    w1, w2 = torch.randn(4, 16, 8), torch.randn(4, 8, 16)
    x = torch.randn(5, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fe.flash_eq_mlp(x, w1, None, w2, None).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="weight2"):
        fe.flash_eq_mlp(x, w1, None, w2[:, :, :-1], None)
    with pytest.raises(ValueError, match="weight2"):
        fe.flash_eq_mlp(x, w1, None, "w2", None)
    with pytest.raises(ValueError, match="in_features"):
        fe.flash_eq_mlp(x[:, :-1], w1, None, w2, None)
    with pytest.raises(RuntimeError, match="dtype"):
        fe.flash_eq_mlp(x, w1, None, w2.double(), None)


def test_fp32_input_stays_fp32_only_on_the_kernels():
    # Off the fused kernels (here: the CPU) an FP32 x needing its gradient is cast by autocast as before;
    # the input check takes the dtype the layer will see.
    from flash_eqlinear.ops import _keeps_fp32_input, autocast_inputs

    x, w = torch.randn(5, 32, requires_grad=True), torch.randn(4, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not _keeps_fp32_input(x, w, 4)
        xc, wc, _ = autocast_inputs(x, w, None, cast_x=False)
        assert xc is x and wc.dtype == torch.bfloat16
        y = fe.flash_eq_linear(x, w)
        assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32
    assert reference.check_inputs(x, wc, None, 4, "planes", input_dtype=torch.bfloat16) == (4, 8, 8)
    with pytest.raises(RuntimeError, match="input dtype torch.float16 does not match"):
        reference.check_inputs(x, wc, None, 4, "planes", input_dtype=torch.float16)


def test_explain_off_the_fused_kernels():
    # The plan of a call that does not reach the fused kernels: the pure-PyTorch form it takes.
    layer = fe.FlashEQLinear(16, 8, group_size=4)
    x = torch.randn(3, 16)
    got = fe.explain(layer, x)
    assert got["backend"] == "reference" and got["form"] in ("fourier", "dense")
    assert fe.explain(fe.FlashEQLinear(24, 12, group_size=3), torch.randn(2, 24))["backend"] == "reference"


# ---- The module's call structure on the fused path, on any machine: an eager FlashEQLinear forward (and
# forward_chunks, and the models' MLP in training) is one call of the layer op, issuing no tensor op of its
# own from Python (casts, checks and reshapes run inside the op, in C++). The op is replaced by a recording
# stand-in and the device test by True; the real op's behaviour is tested in test_layer_op_cuda.py.


class CountOps(TorchDispatchMode):
    """Records the aten ops dispatched while active."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def stand_in(monkeypatch):
    """The layer ops replaced by recorders (outputs made before counting starts), the device test by True."""
    calls = []

    def layer_op(x, weight, bias):
        calls.append(("eq_linear", x, weight, bias))
        return out["y"]

    def chunks_op(x, weight, bias, chunks):
        calls.append(("eq_linear_chunks", x, weight, bias, chunks))
        return [out["y"]]

    out = {}
    for module in (modules, ops):
        monkeypatch.setattr(module, "_LAYER_OP", layer_op)
        monkeypatch.setattr(module, "_CHUNKS_OP", chunks_op)
        monkeypatch.setattr(module, "_fused_eager", lambda x: True)
    return calls, out


@pytest.mark.parametrize("mode", ["train", "eval no_grad", "train autocast"])
def test_forward_is_one_layer_op_call(stand_in, mode):
    calls, out = stand_in
    layer = fe.FlashEQLinear(64, 48).train(mode != "eval no_grad")
    x = torch.randn(2, 5, 64, requires_grad=mode != "eval no_grad")
    out["y"] = torch.zeros(2, 5, 48)
    autocast = torch.autocast("cpu", enabled=mode == "train autocast")
    ctx = torch.no_grad() if mode == "eval no_grad" else autocast
    with ctx, CountOps() as counted:
        y = layer(x)
    assert y is out["y"]
    assert len(calls) == 1 and calls[0][0] == "eq_linear"
    assert calls[0][1] is x and calls[0][2] is layer.weight and calls[0][3] is layer.bias
    assert counted.names == [], counted.names


def test_inference_under_autocast_keeps_its_casts(stand_in, monkeypatch):
    # eval + autocast: the kept 16-bit copies of the parameters go to the op (not the FP32 parameters)
    calls, out = stand_in
    monkeypatch.setattr(modules, "backend_for", lambda x, group_size: "cuda")
    layer = fe.FlashEQLinear(64, 48).eval()
    out["y"] = torch.zeros(3, 48, dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(3, 64))
        layer(torch.randn(3, 64))
    assert len(calls) == 2 and all(c[2].dtype == torch.bfloat16 for c in calls)
    assert calls[0][2] is calls[1][2]  # kept, not cast again


def test_forward_chunks_is_one_op_call(stand_in):
    calls, out = stand_in
    layer = fe.FlashEQLinear(64, 96)
    x = torch.randn(7, 64, requires_grad=True)
    out["y"] = torch.arange(7 * 96.0).reshape(7, 96)
    with CountOps() as counted:
        q, k, v = layer.forward_chunks(x, 3)
    assert [c[0] for c in calls] == ["eq_linear_chunks"] and calls[0][4] == 3
    assert counted.names == ["aten.split.Tensor"]  # the chunks of the whole output: views
    assert torch.equal(torch.cat([q, k, v], -1), out["y"])


def test_mlp_training_is_two_layer_op_calls(stand_in):
    calls, out = stand_in
    fc1, fc2 = fe.FlashEQLinear(64, 128), fe.FlashEQLinear(128, 64)
    x = torch.randn(3, 64, requires_grad=True)
    out["y"] = torch.randn(3, 128)
    fe.flash_eq_mlp(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias)
    assert [c[0] for c in calls] == ["eq_linear", "eq_linear"]
    assert calls[0][2] is fc1.weight and calls[1][2] is fc2.weight
