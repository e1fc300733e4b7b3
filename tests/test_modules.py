"""FlashEQLinear and NaiveEQLinear: parameters, equivalence, export/import, init, training, state."""

import copy
import math

import pytest
import torch
import torch.nn as nn
from conftest import GROUP_SIZES, RefEQLinear, check_export, loop_eq_linear, rel_l2, roll_group

import flash_eqlinear as fe

F64 = torch.float64


def _pair(C, D, T, bias=True, dtype=F64):
    """A NaiveEQLinear and the FlashEQLinear built from its weights."""
    naive = fe.NaiveEQLinear(C, D, bias=bias, group_size=T, dtype=dtype)
    flash = fe.FlashEQLinear.from_naive(
        naive.weight.detach(), None if naive.bias is None else naive.bias.detach()
    )
    return naive, flash


# ---------------------------------------------------------------------------------------------
# Parameters and repr
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T, c, d", [(4, 3, 5), (1, 2, 3), (3, 7, 1), (8, 2, 2)])
def test_parameter_shapes(T, c, d):
    flash = fe.FlashEQLinear(c * T, d * T, group_size=T)
    naive = fe.NaiveEQLinear(c * T, d * T, group_size=T)
    assert flash.weight.shape == (T, d, c)
    assert naive.weight.shape == (d, c, T)
    assert flash.bias.shape == naive.bias.shape == (d,)
    for m in (flash, naive):
        assert (m.in_features, m.out_features, m.group_size) == (c * T, d * T, T)
        assert isinstance(m.weight, nn.Parameter) and isinstance(m.bias, nn.Parameter)
        assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
        assert m.naive_weight().shape == (d, c, T)


def test_extra_repr():
    r = repr(fe.FlashEQLinear(12, 8, bias=False, group_size=4))
    assert r.startswith("FlashEQLinear(")
    assert "in_features=12" in r and "out_features=8" in r and "bias=False" in r and "group_size=4" in r
    r = repr(fe.NaiveEQLinear(6, 9, group_size=3))
    assert (
        r.startswith("NaiveEQLinear(") and "in_features=6" in r and "group_size=3" in r and "bias=True" in r
    )


def test_default_group_size_is_4():
    assert fe.FlashEQLinear(8, 8).weight.shape == (4, 2, 2)
    assert fe.NaiveEQLinear(8, 8).weight.shape == (2, 2, 4)


# ---------------------------------------------------------------------------------------------
# Same function for the same weights
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", GROUP_SIZES)
@pytest.mark.parametrize("c, d", [(3, 5), (5, 3), (1, 1)])
def test_flash_equals_naive(T, c, d, gen):
    naive, flash = _pair(c * T, d * T, T)
    x = torch.randn(2, 7, c * T, generator=gen, dtype=F64)
    with torch.no_grad():
        y_naive, y_flash = naive(x), flash(x)
    assert y_flash.shape == (2, 7, d * T)
    assert rel_l2(y_flash, y_naive) < 1e-13
    expect = loop_eq_linear(x, naive.weight.detach(), naive.bias.detach())
    assert rel_l2(y_naive, expect) < 1e-13
    torch.testing.assert_close(flash.naive_weight(), naive.weight, rtol=0, atol=1e-14)


@pytest.mark.parametrize("T", [1, 3, 4, 6])
def test_modules_are_equivariant(T, gen):
    naive, flash = _pair(3 * T, 2 * T, T)
    x = torch.randn(5, 3 * T, generator=gen, dtype=F64)
    with torch.no_grad():
        for m in (naive, flash):
            assert rel_l2(m(roll_group(x, T)), roll_group(m(x), T)) < 1e-13


@pytest.mark.parametrize("T", [2, 4, 5])
@pytest.mark.parametrize("bias", [True, False])
def test_from_naive_reference_style_shapes(T, bias, gen):
    d, c = 3, 2
    ref = RefEQLinear(c * T, d * T, T, bias=bias).double()
    x = torch.randn(4, c * T, generator=gen, dtype=F64)
    b = None if ref.c is None else ref.c.detach()
    f4 = fe.FlashEQLinear.from_naive(ref.weights.detach(), b)  # (d,1,c,T) and (d,1)
    f3 = fe.FlashEQLinear.from_naive(ref.weights.detach().squeeze(1), None if b is None else b.reshape(-1))
    with torch.no_grad():
        y = ref(x)
        assert rel_l2(f4(x), y) < 1e-13
        assert rel_l2(f3(x), y) < 1e-13
    assert f4.weight.dtype == F64 and (f4.bias is None) == (not bias)
    assert f4.group_size == T and f4.weight.shape == (T, d, c)


def test_from_naive_copies_storage(gen):
    w = torch.randn(2, 3, 4, generator=gen)
    b = torch.randn(2, generator=gen)
    layer = fe.FlashEQLinear.from_naive(w, b)
    b.zero_()
    w.zero_()
    assert layer.bias.abs().sum() > 0 and layer.naive_weight().abs().sum() > 0


# ---------------------------------------------------------------------------------------------
# Dense matrix and export
# ---------------------------------------------------------------------------------------------


def test_torch_export_cpu(tmp_path):
    # torch.export of a model with the layer on the CPU (the reference path): dynamic batch, save / load.
    torch.manual_seed(0)
    model = nn.Sequential(fe.FlashEQLinear(4 * 12, 4 * 20), nn.GELU(), fe.FlashEQLinear(4 * 20, 4 * 8)).eval()
    check_export(model, torch.randn(3, 7, 48), torch.randn(5, 7, 48), tmp_path / "model.pt2")


@pytest.mark.parametrize("T", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
def test_dense_weight_matches_reference_style(T, cls):
    d, c = 3, 2
    ref = RefEQLinear(c * T, d * T, T).double()
    layer = cls(c * T, d * T, group_size=T, dtype=F64)
    w = ref.weights.detach().squeeze(1)
    with torch.no_grad():
        layer.weight.copy_(fe.naive_to_planes(w) if cls is fe.FlashEQLinear else w)
        W = layer.dense_weight()
        assert W.shape == (d * T, c * T)
        torch.testing.assert_close(W, ref.dense(), rtol=0, atol=1e-14)
        # block-circulant structure: block (o, ci) is a circulant T x T matrix.
        blocks = W.reshape(d, T, c, T)
        for t in range(T):
            torch.testing.assert_close(blocks[:, t], torch.roll(blocks[:, 0], t, -1), rtol=0, atol=1e-14)


@pytest.mark.parametrize("T", [1, 4, 6])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
def test_to_linear(T, bias, cls, gen):
    layer = cls(2 * T, 3 * T, bias=bias, group_size=T, dtype=F64)
    lin = layer.to_linear()
    assert type(lin) is nn.Linear
    assert (lin.in_features, lin.out_features) == (2 * T, 3 * T)
    assert lin.weight.dtype == F64 and (lin.bias is None) == (not bias)
    x = torch.randn(2, 4, 2 * T, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(lin(x), layer(x)) < 1e-13
        lin.weight.zero_()  # no shared storage
        assert layer.dense_weight().abs().sum() > 0


@pytest.mark.parametrize("T", [1, 2, 4, 5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_from_linear_round_trip(T, bias, dtype, gen):
    layer = fe.FlashEQLinear(3 * T, 2 * T, bias=bias, group_size=T, dtype=dtype)
    back = fe.FlashEQLinear.from_linear(layer.to_linear(), group_size=T)
    assert back.weight.dtype == dtype and back.group_size == T
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    torch.testing.assert_close(back.naive_weight(), layer.naive_weight(), rtol=0, atol=tol)
    if bias:
        torch.testing.assert_close(back.bias, layer.bias, rtol=0, atol=0)
    else:
        assert back.bias is None
    x = torch.randn(3, 3 * T, generator=gen, dtype=dtype)
    with torch.no_grad():
        assert rel_l2(back(x), layer(x)) < tol * 10


def test_from_linear_of_reference_style_dense(gen):
    ref = RefEQLinear(8, 12, 4).double()
    lin = nn.Linear(8, 12, dtype=F64)
    with torch.no_grad():
        lin.weight.copy_(ref.dense())
        lin.bias.copy_(ref.c.detach().expand(-1, 4).reshape(-1))
    layer = fe.FlashEQLinear.from_linear(lin, 4)
    x = torch.randn(5, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(layer(x), ref(x)) < 1e-13


def test_from_linear_rejects_random_linear():
    with pytest.raises(ValueError, match=r"not block-circulant for group_size=4: block \(output field"):
        fe.FlashEQLinear.from_linear(nn.Linear(8, 8), group_size=4)


def test_from_linear_names_the_block_and_accepts_float32_built_weights(gen):
    lin = fe.FlashEQLinear(16, 12, dtype=F64).to_linear()
    with torch.no_grad():
        noisy = lin.weight + torch.randn(lin.weight.shape, generator=gen, dtype=F64) * 1e-8  # float32-built
    lin.weight.data.copy_(noisy)
    layer = fe.FlashEQLinear.from_linear(lin, group_size=4)  # the default relative tolerance (1e-6)
    with pytest.raises(ValueError, match="block"):  # float64 rounding only: refused
        fe.FlashEQLinear.from_linear(lin, group_size=4, rtol=0)
    x = torch.randn(3, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(layer(x), lin(x)) < 1e-6
        lin.weight[5, 9] += 0.1  # row 5: output field 1; column 9: input field 2
    with pytest.raises(
        ValueError, match=r"block \(output field 1, input field 2\) = rows 4..7, columns 8..11"
    ):
        fe.FlashEQLinear.from_linear(lin, group_size=4)


def test_from_linear_rejects_unshared_bias():
    lin = fe.FlashEQLinear(8, 8, dtype=F64).to_linear()
    with torch.no_grad():
        lin.bias[1] += 0.1  # copy t = 1 of channel 0 no longer equals copy 0
    with pytest.raises(ValueError, match="bias is not shared across the 4 group copies"):
        fe.FlashEQLinear.from_linear(lin, group_size=4)


def test_from_linear_rejects_wrong_group_size():
    lin = fe.FlashEQLinear(12, 12, group_size=4, dtype=F64).to_linear()
    with pytest.raises(ValueError, match="not block-circulant"):
        fe.FlashEQLinear.from_linear(lin, group_size=2)  # divisible, but not 2-circulant
    with pytest.raises(ValueError, match="divisible"):
        fe.FlashEQLinear.from_linear(lin, group_size=5)


# ---------------------------------------------------------------------------------------------
# Initialisation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
def test_init_distribution_like_nn_linear(cls):
    C, D, T = 256, 256, 4
    bound = 1 / math.sqrt(C)
    layer = cls(C, D, group_size=T)
    w = layer.naive_weight().detach().double()
    b = layer.bias.detach().double()
    assert w.abs().max() <= bound * (1 + 1e-5)
    assert b.abs().max() <= bound * (1 + 1e-5)
    # uniform(-bound, bound): mean 0, variance bound^2/3, and it fills the range
    n = w.numel()  # 4096 entries
    assert abs(w.mean().item()) < 4 * bound / math.sqrt(3 * n)
    assert w.var().item() == pytest.approx(bound**2 / 3, rel=0.08)
    assert w.abs().max() > 0.98 * bound
    # histogram roughly flat (not normal): each of 8 bins holds about n/8 entries
    hist = torch.histc(w, bins=8, min=-bound, max=bound)
    assert (hist - n / 8).abs().max() < 0.2 * n / 8
    assert abs(b.mean().item()) < 4 * bound / math.sqrt(3 * b.numel())
    assert b.abs().max() > 0.8 * bound
    # and the dense matrix has nn.Linear(C, D)'s entry variance
    ref = nn.Linear(C, D)
    assert layer.dense_weight().var().item() == pytest.approx(ref.weight.var().item(), rel=0.1)


@pytest.mark.parametrize("T", [1, 3, 4])
def test_init_bound_other_group_sizes(T):
    C = 24 * T
    layer = fe.FlashEQLinear(C, 2 * C, group_size=T)
    assert layer.naive_weight().abs().max() <= (1 + 1e-5) / math.sqrt(C)
    assert layer.bias.abs().max() <= (1 + 1e-5) / math.sqrt(C)


@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
def test_reset_parameters(cls):
    layer = cls(16, 8, group_size=4)
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.fill_(7.0)
    layer.reset_parameters()
    bound = 1 / 4
    w = layer.naive_weight().detach()
    assert w.abs().max() <= bound * (1 + 1e-5) and w.abs().sum() > 0
    assert layer.bias.abs().max() <= bound
    torch.manual_seed(5)
    layer.reset_parameters()
    w1 = layer.weight.detach().clone()
    torch.manual_seed(5)
    layer.reset_parameters()
    torch.testing.assert_close(layer.weight.detach(), w1, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Training: the planes parametrisation follows the naive trajectory exactly
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [2, 3, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_sgd_momentum_weight_decay_same_trajectory(T, bias, gen):
    naive, flash = _pair(3 * T, 2 * T, T, bias=bias)
    opt_n = torch.optim.SGD(naive.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    opt_f = torch.optim.SGD(flash.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    start = naive.weight.detach().clone()
    for _ in range(6):
        x = torch.randn(8, 3 * T, generator=gen, dtype=F64)
        target = torch.randn(8, 2 * T, generator=gen, dtype=F64)
        for m, opt in ((naive, opt_n), (flash, opt_f)):
            opt.zero_grad()
            ((m(x) - target) ** 2).mean().backward()
            opt.step()
        torch.testing.assert_close(flash.naive_weight(), naive.weight, rtol=0, atol=1e-12)
        if bias:
            torch.testing.assert_close(flash.bias, naive.bias, rtol=0, atol=1e-12)
    assert (naive.weight.detach() - start).abs().max() > 1e-3  # it did move


def test_gradients_map_through_planes(gen):
    """grad wrt planes == naive_to_planes(grad wrt w) (orthogonal reparametrisation)."""
    naive, flash = _pair(12, 8, 4)
    x = torch.randn(5, 12, generator=gen, dtype=F64)
    gy = torch.randn(5, 8, generator=gen, dtype=F64)
    naive(x).backward(gy)
    flash(x).backward(gy)
    torch.testing.assert_close(flash.weight.grad, fe.naive_to_planes(naive.weight.grad), rtol=0, atol=1e-13)
    torch.testing.assert_close(flash.bias.grad, naive.bias.grad, rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------
# state_dict
# ---------------------------------------------------------------------------------------------


def test_state_dict_flash_round_trip(gen):
    a = fe.FlashEQLinear(12, 8, group_size=4)
    b = fe.FlashEQLinear(12, 8, group_size=4)
    sd = a.state_dict()
    assert set(sd) == {"weight", "bias"} and sd["weight"].shape == (4, 2, 3)
    b.load_state_dict(sd)
    torch.testing.assert_close(b.weight, a.weight, rtol=0, atol=0)
    torch.testing.assert_close(b.bias, a.bias, rtol=0, atol=0)


def test_state_dict_has_no_derived_state():
    for cls in (fe.FlashEQLinear, fe.NaiveEQLinear):
        layer = cls(8, 8)
        train_keys = set(layer.train().state_dict())
        assert train_keys == set(layer.eval().state_dict()) == {"weight", "bias"}


@pytest.mark.parametrize("T, c, d", [(4, 3, 2), (2, 5, 3), (3, 1, 4)])
def test_load_naive_state_dict_into_flash(T, c, d, gen):
    naive = fe.NaiveEQLinear(c * T, d * T, group_size=T, dtype=F64)
    flash = fe.FlashEQLinear(c * T, d * T, group_size=T, dtype=F64)
    flash.load_state_dict(naive.state_dict())
    x = torch.randn(4, c * T, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(flash(x), naive(x)) < 1e-13


def test_load_same_naive_state_dict_twice(gen):
    """Loading must not mutate the caller's state_dict (or its metadata): a second load works too."""
    naive = fe.NaiveEQLinear(8, 12, dtype=F64)
    sd = naive.state_dict()
    meta_before = {k: dict(v) for k, v in sd._metadata.items()}
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    for _ in range(2):
        flash = fe.FlashEQLinear(8, 12, dtype=F64)
        flash.load_state_dict(sd)
        with torch.no_grad():
            assert rel_l2(flash(x), naive(x)) < 1e-13
    assert {k: dict(v) for k, v in sd._metadata.items()} == meta_before
    assert sd["weight"].shape == (3, 2, 4)


@pytest.mark.parametrize("bias", [True, False])
def test_load_reference_style_dict_into_flash(bias, gen):
    ref = RefEQLinear(12, 8, 4, bias=bias).double()
    sd = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    assert set(sd) == ({"weights", "c"} if bias else {"weights"})
    flash = fe.FlashEQLinear(12, 8, bias=bias, group_size=4, dtype=F64)
    flash.load_state_dict(sd)
    assert set(sd) == ({"weights", "c"} if bias else {"weights"})  # caller's dict untouched
    x = torch.randn(3, 12, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(flash(x), ref(x)) < 1e-13


def test_ambiguous_shapes_naive_checkpoint_converted(gen):
    """T = d = c = 4: (T, d, c) == (d, c, T). The metadata must decide, not the shape."""
    naive = fe.NaiveEQLinear(16, 16, group_size=4, dtype=F64)
    flash = fe.FlashEQLinear(16, 16, group_size=4, dtype=F64)
    assert tuple(naive.weight.shape) == tuple(flash.weight.shape) == (4, 4, 4)
    flash.load_state_dict(naive.state_dict())
    x = torch.randn(5, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(flash(x), naive(x)) < 1e-13
    torch.testing.assert_close(flash.naive_weight(), naive.weight, rtol=0, atol=1e-14)


def test_ambiguous_shapes_flash_checkpoint_not_converted(gen):
    a = fe.FlashEQLinear(16, 16, group_size=4, dtype=F64)
    b = fe.FlashEQLinear(16, 16, group_size=4, dtype=F64)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.weight, a.weight, rtol=0, atol=0)
    x = torch.randn(5, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(b(x), a(x)) < 1e-15


def test_ambiguous_shapes_reference_style(gen):
    ref = RefEQLinear(16, 16, 4).double()
    flash = fe.FlashEQLinear(16, 16, group_size=4, dtype=F64)
    flash.load_state_dict(ref.state_dict())
    x = torch.randn(5, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(flash(x), ref(x)) < 1e-13


def test_plain_dict_without_metadata(gen):
    """A rebuilt dict (no _metadata): a (d, c, T) weight is converted only where the shape is unambiguous."""
    x = torch.randn(3, 12, generator=gen, dtype=F64)
    naive = fe.NaiveEQLinear(12, 8, dtype=F64)  # (d, c, T) = (2, 3, 4) vs planes (4, 2, 3)
    flash = fe.FlashEQLinear(12, 8, dtype=F64)
    flash.load_state_dict(dict(naive.state_dict()))
    with torch.no_grad():
        assert rel_l2(flash(x), naive(x)) < 1e-13
    # ambiguous shapes and no metadata: taken as this layer's own (a rebuilt Flash checkpoint stays intact),
    # with a warning that names the other layout and its conversion
    for cls, fix in ((fe.FlashEQLinear, "naive_to_planes"), (fe.NaiveEQLinear, "planes_to_naive")):
        a, b = cls(16, 16, dtype=F64), cls(16, 16, dtype=F64)
        with pytest.warns(UserWarning, match=f"no layout metadata.*fits both layouts.*{fix}"):
            b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
        torch.testing.assert_close(b.weight, a.weight, rtol=0, atol=0)


def test_naive_state_dict_loads_into_naive():
    a, b = fe.NaiveEQLinear(8, 12), fe.NaiveEQLinear(8, 12)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.weight, a.weight, rtol=0, atol=0)


def test_load_nested_naive_state_dict(gen):
    naive = nn.Sequential(fe.NaiveEQLinear(8, 16, dtype=F64), nn.ReLU(), fe.NaiveEQLinear(16, 16, dtype=F64))
    flash = nn.Sequential(fe.FlashEQLinear(8, 16, dtype=F64), nn.ReLU(), fe.FlashEQLinear(16, 16, dtype=F64))
    flash.load_state_dict(naive.state_dict())
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(flash(x), naive(x)) < 1e-13


# ---------------------------------------------------------------------------------------------
# Options: bias=False, autocast, dtype/device
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
def test_bias_false(cls, gen):
    layer = cls(8, 12, bias=False, dtype=F64)
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ["weight"]
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        expect = loop_eq_linear(x, layer.naive_weight(), None)
        assert rel_l2(layer(x), expect) < 1e-13
    assert set(layer.state_dict()) == {"weight"}


@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_cpu_follows_nn_linear(cls, dtype, gen):
    layer = cls(16, 8, group_size=4)
    lin = nn.Linear(16, 8)
    x = torch.randn(3, 16, generator=gen)
    with torch.autocast("cpu", dtype=dtype):
        y_lin = lin(x)
        y = layer(x)
    assert y.dtype == y_lin.dtype == dtype
    with torch.no_grad():
        y32 = layer(x)
    assert y32.dtype == torch.float32
    assert rel_l2(y, y32) < 3e-2
    y.float().sum().backward()  # gradients flow back to the fp32 parameters
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_autocast_cpu_leaves_float64_alone(gen):
    layer = fe.FlashEQLinear(16, 8, dtype=F64)
    lin = nn.Linear(16, 8, dtype=F64)
    x = torch.randn(3, 16, generator=gen, dtype=F64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == lin(x).dtype == F64


def test_autocast_disabled_region(gen):
    layer = fe.FlashEQLinear(16, 8)
    x = torch.randn(3, 16, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autocast("cpu", enabled=False):
        assert layer(x).dtype == torch.float32


@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_dtype_argument(cls, dtype, gen):
    layer = cls(8, 12, dtype=dtype)
    assert layer.weight.dtype == layer.bias.dtype == dtype
    y = layer(torch.randn(2, 8, generator=gen).to(dtype))
    assert y.dtype == dtype and y.shape == (2, 12)


def test_default_dtype_respected():
    prev = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        assert fe.FlashEQLinear(8, 8).weight.dtype == F64
    finally:
        torch.set_default_dtype(prev)


@pytest.mark.parametrize("cls", [fe.FlashEQLinear, fe.NaiveEQLinear])
def test_meta_device_construction(cls):
    layer = cls(16, 8, device="meta")
    assert layer.weight.device.type == "meta" and layer.bias.device.type == "meta"
    assert layer.weight.shape == ((4, 2, 4) if cls is fe.FlashEQLinear else (2, 4, 4))
    y = layer(torch.empty(3, 5, 16, device="meta"))
    assert y.device.type == "meta" and y.shape == (3, 5, 8)
    real = layer.to_empty(device="cpu")
    real.reset_parameters()
    assert torch.isfinite(real.weight).all() and real.naive_weight().abs().max() <= 0.25 * (1 + 1e-5)


def test_module_to_dtype(gen):
    layer = fe.FlashEQLinear(8, 8).to(F64)
    x = torch.randn(2, 8, generator=gen, dtype=F64)
    assert layer(x).dtype == F64


def test_naive_layer_follows_autocast(gen):
    layer, lin = fe.NaiveEQLinear(16, 8), nn.Linear(16, 8)
    x = torch.randn(3, 16, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        assert y.dtype == lin(x).dtype == torch.bfloat16
    ref = layer(x)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-2


@pytest.mark.parametrize("shape", [(16, 12), (16, 16)])  # (16, 16): T = d = c = 4, shapes coincide
def test_naive_layer_loads_flash_checkpoint(gen, shape):
    flash = fe.FlashEQLinear(*shape, dtype=F64)
    naive = fe.NaiveEQLinear(*shape, dtype=F64)
    naive.load_state_dict(flash.state_dict())
    x = torch.randn(5, shape[0], generator=gen, dtype=F64)
    assert torch.allclose(naive(x), flash(x), atol=1e-12)


def test_conversion_rounds_once_into_the_layer_dtype(gen):
    naive = fe.NaiveEQLinear(16, 12, dtype=torch.float16)
    flash = fe.FlashEQLinear(16, 12, dtype=torch.float32)
    flash.load_state_dict(naive.state_dict())
    exact = fe.naive_to_planes(naive.weight.detach().double())
    assert (flash.weight.detach().double() - exact).abs().max().item() < 1e-6


def test_from_naive_rejects_bad_bias():
    w = torch.randn(3, 2, 4)
    with pytest.raises(TypeError, match="bias"):
        fe.FlashEQLinear.from_naive(w, [1.0, 2.0, 3.0])
    with pytest.raises(RuntimeError, match="must match weight"):
        fe.FlashEQLinear.from_naive(w, torch.randn(3, dtype=F64))


def test_autocast_does_not_cast_integer_weights(gen):
    x = torch.randn(2, 16, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="floating"):
        fe.flash_eq_linear(x, torch.ones(4, 3, 4, dtype=torch.int64), None, 4)


# ---------------------------------------------------------------------------------------------
# NaiveEQLinear: the expanded weight is reused in inference, and only there
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def count_expansions(monkeypatch):
    """Counts calls of reference.dense_weight (the expansion) made through the naive layer."""
    calls = []
    real = fe.reference.dense_weight

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fe.reference, "dense_weight", counted)
    return calls


def _expect(layer, x):
    w, b = layer.naive_weight().detach(), layer.bias
    return loop_eq_linear(x, w, None if b is None else b.detach())


@pytest.mark.parametrize("ctx", [torch.no_grad, torch.inference_mode])
def test_naive_inference_reuses_expansion(ctx, count_expansions, gen):
    layer = fe.NaiveEQLinear(12, 8, dtype=F64).eval()
    x = torch.randn(5, 12, generator=gen, dtype=F64)
    with ctx():
        y1, y2 = layer(x), layer(x)
    assert len(count_expansions) == 1
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    assert rel_l2(y1, _expect(layer, x)) < 1e-13


@pytest.mark.parametrize(
    "update",
    [
        lambda m: m.weight.mul_(-2.0),
        lambda m: m.weight.copy_(torch.randn_like(m.weight)),
        lambda m: m.load_state_dict(fe.NaiveEQLinear(12, 8, dtype=F64).state_dict()),
        lambda m: setattr(m, "weight", nn.Parameter(torch.randn_like(m.weight))),
        lambda m: m.eval(),  # after a write through .data the documented refresh
    ],
    ids=["mul_", "copy_", "load_state_dict", "new_parameter", "eval_after_data_write"],
)
def test_naive_cache_follows_weight_updates(update, gen):
    layer = fe.NaiveEQLinear(12, 8, dtype=F64).eval()
    x = torch.randn(5, 12, generator=gen, dtype=F64)
    with torch.no_grad():
        layer(x)
        layer.weight.data.add_(1.0)  # invisible to the version check: only eval() refreshes after it
        update(layer)
        assert rel_l2(layer(x), _expect(layer, x)) < 1e-13


def test_naive_cache_follows_optimizer_step(gen):
    layer = fe.NaiveEQLinear(12, 8, dtype=F64)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    x = torch.randn(5, 12, generator=gen, dtype=F64)
    for _ in range(3):
        layer.eval()
        with torch.no_grad():
            assert rel_l2(layer(x), _expect(layer, x)) < 1e-13
        layer.train()
        opt.zero_grad()
        layer(x).square().sum().backward()
        opt.step()
        with torch.no_grad():  # eval mode was left: the step is seen on the next eval pass too
            layer.eval()
            assert rel_l2(layer(x), _expect(layer, x)) < 1e-13


def test_naive_no_cache_in_training_or_with_weight_grad(count_expansions, gen):
    layer = fe.NaiveEQLinear(12, 8, dtype=F64)
    x = torch.randn(5, 12, generator=gen, dtype=F64)
    with torch.no_grad():
        layer(x), layer(x)  # training mode: expanded per call
    assert len(count_expansions) == 2
    layer.eval()
    y = layer(x)  # grad enabled and the weight requires it: expanded per call, gradients flow
    layer(x)
    assert len(count_expansions) == 4 and layer._cache is None
    y.sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_naive_cache_frozen_weight_input_grad(gen):
    """Eval mode, frozen weight, gradient w.r.t. the input (saliency): the cached path is differentiable
    in x, also when the cache was filled under inference_mode."""
    layer = fe.NaiveEQLinear(12, 8, dtype=F64).eval().requires_grad_(False)
    with torch.inference_mode():
        layer(torch.randn(2, 12, dtype=F64))
    x = torch.randn(5, 12, generator=gen, dtype=F64, requires_grad=True)
    y = layer(x)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    xr = x.detach().requires_grad_()
    (gr,) = torch.autograd.grad(_expect(layer, xr).square().sum(), xr)
    torch.testing.assert_close(gx, gr, rtol=1e-12, atol=1e-12)


def test_naive_cache_dtype_changes(gen):
    layer = fe.NaiveEQLinear(12, 8, dtype=F64).eval()
    x = torch.randn(5, 12, generator=gen, dtype=F64)
    with torch.no_grad():
        layer(x)
        layer.float()
        y32 = layer(x.float())
        assert y32.dtype == torch.float32
        assert rel_l2(y32.double(), _expect(layer, x.float()).double()) < 1e-6
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yb = layer(x.float())
        assert yb.dtype == torch.bfloat16
        assert layer._cache[2].dtype == torch.bfloat16


def test_naive_cache_not_pickled(gen):
    import io

    layer = fe.NaiveEQLinear(12, 8, dtype=F64).eval()
    with torch.no_grad():
        layer(torch.randn(2, 12, generator=gen, dtype=F64))
    buf = io.BytesIO()
    torch.save(layer, buf)
    assert layer._cache is not None
    buf.seek(0)
    assert torch.load(buf, weights_only=False)._cache is None


def test_flash_autocast_inference_reuses_casts(gen):
    """Eval-mode inference under autocast keeps the weight and bias cast to autocast's dtype until they
    change; training mode and recorded gradients cast per call. The same outputs either way."""
    bf16 = torch.bfloat16
    layer = fe.FlashEQLinear(32, 24).eval()
    x = torch.randn(5, 32, generator=gen)
    with torch.autocast("cpu", dtype=bf16):
        with torch.no_grad():
            y1 = layer(x)
            cached = layer._cache[2]  # on the CPU (dense form) also the expanded weight and bias
            assert [t.dtype for t in cached["params"]] == [bf16, bf16]
            assert torch.equal(layer(x), y1) and layer._cache[2] is cached
            layer.weight.mul_(2)  # an in-place update: cast again
            y2 = layer(x)
            assert layer._cache[2] is not cached
            assert torch.equal(y2, fe.flash_eq_linear(x, layer.weight.to(bf16), layer.bias.to(bf16)))
        y = layer(x)  # gradients recorded: cast per call, and they reach the parameters
        assert torch.equal(y.detach(), y2)
        y.float().sum().backward()
        assert layer.weight.grad.abs().sum() > 0 and layer.bias.grad.abs().sum() > 0
        layer.train()
        assert layer._cache is None
        with torch.no_grad():
            assert torch.equal(layer(x), y2) and layer._cache is None


def test_flash_inference_keeps_dense_weight(gen):
    """Off the fused kernels in the dense form, eval-mode inference keeps the expanded weight (as
    NaiveEQLinear does): the outputs of the form computed per call, bit for bit, until the weight changes."""
    layer = fe.FlashEQLinear(32, 24, dtype=F64).eval()
    x = torch.randn(5, 32, generator=gen, dtype=F64)
    with torch.no_grad():
        y1 = layer(x)
        kept = layer._cache[2]
        assert [tuple(t.shape) for t in kept["params"] + kept["dense"]] == [(4, 6, 8), (6,), (24, 32), (24,)]
        assert torch.equal(y1, fe.flash_eq_linear(x, layer.weight, layer.bias))
        assert torch.equal(layer(x), y1) and layer._cache[2] is kept
        layer.weight.mul_(-2.0)
        y2 = layer(x)
        assert layer._cache[2] is not kept
        assert torch.equal(y2, fe.flash_eq_linear(x, layer.weight, layer.bias))
        assert rel_l2(y2, _expect(layer, x)) < 1e-13
    y = layer(x)  # gradients recorded: nothing kept, and they reach the parameters
    assert layer._cache is None and torch.equal(y.detach(), y2)
    y.sum().backward()
    assert layer.weight.grad.abs().sum() > 0


def test_flash_inference_casts_shared_by_both_forms(gen):
    """Under autocast, the Fourier form (from 256 rows) and the kept dense form (fewer) share one entry: the
    weight and bias cast once, the expansion added once, whatever the order of the calls."""
    bf16 = torch.bfloat16
    layer = fe.FlashEQLinear(1024, 1024).eval()
    small, large = torch.randn(8, 1024, generator=gen), torch.randn(256, 1024, generator=gen)
    with torch.autocast("cpu", dtype=bf16), torch.no_grad():
        y_large = layer(large)
        kept = layer._cache[2]
        params = kept["params"]
        assert [t.dtype for t in params] == [bf16, bf16] and "dense" not in kept
        y_small = layer(small)
        assert layer._cache[2] is kept and kept["params"] is params and kept["dense"][0].shape == (1024, 1024)
        dense = kept["dense"]
        assert torch.equal(layer(large), y_large) and torch.equal(layer(small), y_small)
        assert layer._cache[2] is kept and kept["dense"] is dense
        assert torch.equal(y_large, fe.flash_eq_linear(large, *params))
        q, k, v = layer.forward_chunks(small, 4)[:3]  # off the fused kernels: views of forward's output
        assert torch.equal(torch.cat([q, k, v], -1), y_small[:, :768]) and layer._cache[2] is kept


@pytest.mark.slow
def test_flash_inference_form_by_rows(gen):
    """With the dense weight kept, few rows take the dense form even where the Fourier form runs per call;
    both exact."""
    layer = fe.FlashEQLinear(1024, 1024, dtype=F64).eval()  # T sqrt(c d) = 1024: Fourier per call
    with torch.no_grad():
        for rows, kept in ((8, True), (256, False)):
            x = torch.randn(rows, 1024, generator=gen, dtype=F64)
            layer.train(), layer.eval()  # nothing kept
            y = layer(x)
            assert (layer._cache is not None) == kept
            assert rel_l2(y, _expect(layer, x)) < 1e-13


@pytest.mark.parametrize("cls", [fe.NaiveEQLinear, fe.FlashEQLinear])
def test_cache_sees_fused_optimizer_steps(cls, gen):
    """Fine-tuning in eval mode with a fused optimizer, which updates the parameters without bumping their
    version: the forward that records gradients drops what the layer kept, so the next inference call
    sees the new parameters."""
    layer = cls(32, 24).eval()
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True)
    x = torch.randn(5, 32, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):
            with torch.no_grad():
                y = layer(x)
                fresh = copy.deepcopy(layer)(x)  # a copy keeps nothing
                assert torch.equal(y, fresh)
            opt.zero_grad()
            layer(x).float().square().sum().backward()
            opt.step()  # (torch 2.13: the parameters' _version stays as it was)


def test_naive_inference_checks_inputs_like_training():
    layer = fe.NaiveEQLinear(8, 12).eval()
    with torch.no_grad():
        layer(torch.randn(2, 8))  # fills the cache
        with pytest.raises(ValueError, match="in_features"):
            layer(torch.randn(2, 7))
        with pytest.raises(RuntimeError, match="dtype"):
            layer(torch.randn(2, 8, dtype=F64))
