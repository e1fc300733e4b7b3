"""swap_eq_linear on whole models and convert_state_dict on their checkpoints."""

import copy

import pytest
import torch
import torch.nn as nn
from conftest import RefEQLinear, rel_l2

import flash_eqlinear as fe
from flash_eqlinear.swap import is_naive_eq_linear

F64 = torch.float64


class Block(nn.Module):
    def __init__(self, C, T):
        super().__init__()
        self.norm = nn.LayerNorm(C)
        self.mlp = nn.Sequential(
            RefEQLinear(C, 2 * C, T), nn.GELU(), fe.NaiveEQLinear(2 * C, C, group_size=T)
        )
        self.proj = nn.Linear(C, C)  # plain dense layer: must stay

    def forward(self, x):
        return x + self.proj(self.mlp(self.norm(x)))


class Net(nn.Module):
    """Several nesting levels: Sequential, ModuleList, ModuleDict, plain attributes."""

    def __init__(self, C=8, T=4):
        super().__init__()
        self.stem = RefEQLinear(C, C, T)
        self.blocks = nn.ModuleList([Block(C, T), Block(C, T)])
        self.heads = nn.ModuleDict(
            {"a": fe.NaiveEQLinear(C, C, group_size=T, bias=False), "b": RefEQLinear(C, C, T, bias=False)}
        )
        self.out = nn.Linear(C, 3)

    def forward(self, x):
        x = self.stem(x)
        for blk in self.blocks:
            x = blk(x)
        return self.out(self.heads["a"](x) + self.heads["b"](x))


EQ_NAMES = [
    "stem",
    "blocks.0.mlp.0",
    "blocks.0.mlp.2",
    "blocks.1.mlp.0",
    "blocks.1.mlp.2",
    "heads.a",
    "heads.b",
]


def _model(T=4, C=8):
    torch.manual_seed(3)
    return Net(C, T).double()


@pytest.mark.parametrize("T", [2, 4])
def test_swap_replaces_all_and_keeps_outputs(T, gen):
    model = _model(T, 4 * T)
    x = torch.randn(2, 5, 4 * T, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    names = fe.swap_eq_linear(model, params="planes")
    assert sorted(names) == sorted(EQ_NAMES)
    for name in EQ_NAMES:
        m = model.get_submodule(name)
        assert type(m) is fe.FlashEQLinear and m.group_size == T and m.weight.dtype == F64
    assert model.heads["a"].bias is None and model.heads["b"].bias is None
    assert model.stem.bias is not None
    # plain dense layers untouched
    assert type(model.out) is nn.Linear and type(model.blocks[0].proj) is nn.Linear
    assert not any(is_naive_eq_linear(m) for m in model.modules())
    with torch.no_grad():
        after = model(x)
    assert rel_l2(after, before) < 1e-13


def test_swap_is_idempotent():
    model = _model()
    assert len(fe.swap_eq_linear(model, params="planes")) == len(EQ_NAMES)
    assert fe.swap_eq_linear(model, params="planes") == []


def test_swap_include_globs(gen):
    model = _model()
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    names = fe.swap_eq_linear(model, params="planes", include=["blocks.*.mlp.*", "stem"])
    assert sorted(names) == sorted(EQ_NAMES[:5])
    assert isinstance(model.heads["a"], fe.NaiveEQLinear) and isinstance(model.heads["b"], RefEQLinear)
    assert isinstance(model.blocks[1].mlp[2], fe.FlashEQLinear)
    with torch.no_grad():
        assert rel_l2(model(x), before) < 1e-13


def test_swap_include_single_glob_string():
    model = _model()
    assert fe.swap_eq_linear(model, params="planes", include="heads.*") == ["heads.a", "heads.b"]


def test_swap_include_predicate():
    model = _model()
    seen = []

    def pred(name, module):
        seen.append(name)
        return isinstance(module, RefEQLinear)

    names = fe.swap_eq_linear(model, params="planes", include=pred)
    assert sorted(names) == sorted(["stem", "blocks.0.mlp.0", "blocks.1.mlp.0", "heads.b"])
    assert set(seen) == set(EQ_NAMES)  # only candidate layers are offered to the predicate
    assert isinstance(model.heads["a"], fe.NaiveEQLinear)


def test_swap_keeps_eval_mode_and_frozen_params():
    model = _model()
    model.eval()
    model.blocks[0].mlp[0].weights.requires_grad_(False)
    model.heads["a"].weight.requires_grad_(False)
    model.stem.c.requires_grad_(False)
    model.blocks[1].train()
    fe.swap_eq_linear(model, params="planes")
    assert not model.blocks[0].mlp[0].training and not model.stem.training
    assert model.blocks[1].mlp[0].training and model.blocks[1].mlp[2].training
    assert not model.blocks[0].mlp[0].weight.requires_grad
    assert model.blocks[0].mlp[0].bias.requires_grad
    assert not model.heads["a"].weight.requires_grad
    assert model.stem.weight.requires_grad and not model.stem.bias.requires_grad
    assert model.blocks[1].mlp[0].weight.requires_grad


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_swap_keeps_dtype(dtype):
    model = _model().to(dtype)
    fe.swap_eq_linear(model, params="planes")
    assert all(p.dtype == dtype for p in model.parameters())


def test_swap_root_and_non_module():
    layer = fe.NaiveEQLinear(8, 8)
    with pytest.raises(ValueError, match="itself a naive EQ-Linear.*from_naive"):
        fe.swap_eq_linear(layer, params="planes")  # the root itself cannot be replaced in place
    assert fe.swap_eq_linear(layer, params="planes", include="blocks.*") == []  # not selected: nothing to do
    assert isinstance(layer, fe.NaiveEQLinear)
    with pytest.raises(TypeError, match="nn.Module"):
        fe.swap_eq_linear({"a": layer})


def test_swap_shared_layer_replaced_everywhere(gen):
    shared = fe.NaiveEQLinear(8, 8, dtype=F64)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    fe.swap_eq_linear(model, params="planes")
    assert isinstance(model[0], fe.FlashEQLinear) and model[2] is model[0]  # still shared
    with torch.no_grad():
        assert rel_l2(model(x), before) < 1e-13


def test_swap_shared_layer_selected_under_one_name(gen):
    """``include`` naming one of a shared layer's names replaces it under all of them (tying kept)."""
    shared = fe.NaiveEQLinear(8, 8, dtype=F64)
    model = nn.Module()
    model.a, model.b, model.other = shared, shared, fe.NaiveEQLinear(8, 8, dtype=F64)
    assert fe.swap_eq_linear(model, params="planes", include="a") == ["a", "b"]
    assert isinstance(model.a, fe.FlashEQLinear) and model.b is model.a
    assert isinstance(model.other, fe.NaiveEQLinear)


def test_is_naive_eq_linear():
    assert is_naive_eq_linear(RefEQLinear(8, 8, 4))
    assert is_naive_eq_linear(RefEQLinear(6, 9, 3, bias=False))
    assert is_naive_eq_linear(fe.NaiveEQLinear(8, 8))
    assert not is_naive_eq_linear(fe.FlashEQLinear(8, 8))
    assert not is_naive_eq_linear(nn.Linear(8, 8))
    bad = RefEQLinear(8, 8, 4)
    bad.tranNum = 2  # weights' last axis says 4
    assert not is_naive_eq_linear(bad)


@pytest.mark.parametrize("T", [2, 4])
def test_convert_state_dict_loads_into_swapped_model(T, gen):
    model = _model(T, 4 * T)
    sd = model.state_dict()
    x = torch.randn(2, 4 * T, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    new = fe.convert_state_dict(sd)
    assert "stem.weights" in sd and "stem.c" in sd  # input not modified
    assert "stem.weights" not in new and "stem.c" not in new
    assert new["stem.weight"].shape == (T, 4, 4) and new["stem.bias"].shape == (4,)
    assert torch.equal(new["out.weight"], sd["out.weight"])  # other entries unchanged
    assert torch.equal(new["blocks.0.proj.weight"], sd["blocks.0.proj.weight"])

    fresh = _model(T, 4 * T)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()  # make sure the outputs come from the loaded checkpoint
    fe.swap_eq_linear(fresh, params="planes")
    fresh.load_state_dict(new)  # strict
    with torch.no_grad():
        assert rel_l2(fresh(x), before) < 1e-13


def test_convert_state_dict_ambiguous_shapes(gen):
    """T = d = c = 4 naive layers: converted by metadata although the shape looks like planes'."""
    model = nn.Sequential(fe.NaiveEQLinear(16, 16, dtype=F64), RefEQLinear(16, 16, 4).double())
    x = torch.randn(3, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    new = fe.convert_state_dict(model.state_dict())
    fe.swap_eq_linear(model, params="planes")
    model.load_state_dict(new)
    with torch.no_grad():
        assert rel_l2(model(x), before) < 1e-13
    # a converted checkpoint is not converted again
    again = fe.convert_state_dict(new)
    torch.testing.assert_close(again["0.weight"], new["0.weight"], rtol=0, atol=0)


def test_swapped_model_state_dict_round_trip(gen):
    model = _model()
    fe.swap_eq_linear(model, params="planes")
    other = copy.deepcopy(model)
    for p in other.parameters():
        p.data.zero_()
    other.load_state_dict(model.state_dict())
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(other(x), model(x)) == 0.0


def test_convert_state_dict_leaves_lookalike_keys_alone():
    """Only a parameter named exactly ``weights`` is a reference-style EQ weight."""
    sd = {"head.class_weights": torch.randn(3, 1, 2, 4), "head.bias": torch.randn(3)}
    new = fe.convert_state_dict(sd)
    assert set(new) == set(sd)
    assert torch.equal(new["head.class_weights"], sd["head.class_weights"])


def test_convert_state_dict_type_error():
    with pytest.raises(TypeError, match="dict"):
        fe.convert_state_dict([torch.zeros(1)])


def test_convert_state_dict_only_named_layers():
    w = torch.randn(3, 1, 2, 4)
    conv_like = torch.randn(8, 1, 3, 3)  # an unrelated parameter that looks reference-style
    sd = {"eq.weights": w, "eq.c": torch.randn(3, 1), "dw.weights": conv_like}
    out = fe.convert_state_dict(sd, only=["eq"])
    assert "eq.weight" in out and "eq.weights" not in out
    assert out["dw.weights"] is conv_like
    assert "dw.weight" in fe.convert_state_dict(sd)  # without `only`, every match converts
    with pytest.warns(UserWarning, match=r"no entries under \['fc9'\].*'module\.'"):
        out = fe.convert_state_dict(sd, only=["eq", "fc9"])  # e.g. a name without its wrapper's prefix
    assert "eq.weight" in out


# ---- The default swap keeps the naive layers' parameters (SwappedEQLinear) ----


class IndexEQLinear(nn.Module):
    """The other public layout: ``weight`` (d, 1, c, T), ``bias`` (d,), a persistent index buffer, T from the
    weight; the reference convention (output copy t uses the weight rolled by t)."""

    def __init__(self, in_features, out_features, T=4):
        super().__init__()
        c, d = in_features // T, out_features // T
        self.weight = nn.Parameter(torch.randn(d, 1, c, T) / (c * T) ** 0.5)
        self.bias = nn.Parameter(torch.randn(d))
        self.register_buffer("shift_index", torch.arange(T).repeat(T, 1))

    def forward(self, x):
        d, _, c, T = self.weight.shape
        W = torch.cat([torch.roll(self.weight, t, -1) for t in range(T)], 1).reshape(d * T, c * T)
        return x @ W.t() + self.bias.repeat_interleave(T)


class Mixed(nn.Module):
    def __init__(self, C=16, T=4):
        super().__init__()
        self.a = RefEQLinear(C, 2 * C, T)
        self.b = IndexEQLinear(2 * C, C, T)
        self.c = fe.NaiveEQLinear(C, C, group_size=T)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("C", [16, pytest.param(1024, marks=pytest.mark.slow)])  # dense form; Fourier form
def test_default_swap_keeps_parameters_state_dict_and_adamw_trajectory(C, gen):
    torch.manual_seed(0)
    naive = Mixed(C).double()
    fast = copy.deepcopy(naive)
    opt_naive = torch.optim.AdamW(naive.parameters(), lr=1e-2, weight_decay=0.05)
    opt_fast = torch.optim.AdamW(fast.parameters(), lr=1e-2, weight_decay=0.05)  # built before the swap
    params_before = dict(fast.named_parameters())
    sd_before = {k: tuple(v.shape) for k, v in fast.state_dict().items()}
    assert fe.swap_eq_linear(fast) == ["a", "b", "c"]
    assert all(isinstance(m, fe.SwappedEQLinear) for m in (fast.a, fast.b, fast.c))
    assert {k: p for k, p in fast.named_parameters()} == params_before  # the same Parameter objects
    assert {k: tuple(v.shape) for k, v in fast.state_dict().items()} == sd_before
    x = torch.randn(3, 7, C, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(fast(x), naive(x)) < 1e-12
    for _ in range(5):
        for model, opt in ((naive, opt_naive), (fast, opt_fast)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for (name, p), q in zip(naive.named_parameters(), fast.parameters(), strict=True):
        assert rel_l2(q, p) < 1e-10, name
    # checkpoints in both directions, no conversion
    back = Mixed(C).double()
    back.load_state_dict(fast.state_dict())
    fast.load_state_dict(naive.state_dict())


def test_swapped_layer_inference_keeps_planes_and_training_drops_them(gen):
    layer = RefEQLinear(1024, 1024).double()
    swapped = fe.SwappedEQLinear(layer).eval()
    x = torch.randn(300, 1024, generator=gen, dtype=F64)  # the Fourier form (planes) on CPU
    with torch.no_grad():
        y = swapped(x)
        kept = swapped._cache[2]
        assert torch.equal(swapped(x), y) and swapped._cache[2] is kept
        layer.weights.add_(1.0)  # an in-place update: made again
        assert rel_l2(swapped(x), layer(x)) < 1e-12 and swapped._cache[2] is not kept
    swapped.train()
    swapped(x).sum().backward()
    assert swapped._cache is None and layer.weights.grad is not None and layer.c.grad is not None


def test_planes_swap_keeps_buffers_and_exports_back(gen):
    torch.manual_seed(1)
    naive = Mixed(16).double()
    original = copy.deepcopy(naive.state_dict())
    planes = copy.deepcopy(naive)
    fe.swap_eq_linear(planes, params="planes")
    assert all(type(m) is fe.FlashEQLinear for m in (planes.a, planes.b, planes.c))
    assert torch.equal(planes.b.shift_index, naive.b.shift_index)  # the index buffer stays
    planes.load_state_dict(original)  # the original checkpoint loads (converted on load)
    x = torch.randn(4, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(planes(x), naive(x)) < 1e-12
    back = fe.naive_state_dict(planes)  # the naive layouts the layers came from
    assert {k: tuple(v.shape) for k, v in back.items()} == {k: tuple(v.shape) for k, v in original.items()}
    for k, v in original.items():
        assert rel_l2(back[k], v) < 1e-14, k
    restored = Mixed(16).double()
    restored.load_state_dict(back)  # strict: loads into the original code
    with torch.no_grad():
        assert rel_l2(restored(x), naive(x)) < 1e-12
    # a checkpoint file converted to planes loads into the planes model; its index buffer accepted
    converted = fe.convert_state_dict(original)
    fresh = Mixed(16).double()
    fe.swap_eq_linear(fresh, params="planes")
    fresh.load_state_dict(converted)
    direct = fe.FlashEQLinear(32, 16).double()  # a FlashEQLinear without the buffer accepts the entry
    direct.load_state_dict({k[2:]: v for k, v in original.items() if k.startswith("b.")})
    with torch.no_grad():
        assert rel_l2(fresh(x), naive(x)) < 1e-12
        h = torch.randn(4, 32, generator=gen, dtype=F64)
        assert rel_l2(direct(h), naive.b(h)) < 1e-12


def test_registered_layout():
    class Custom(nn.Module):  # a user's layer: weight (d, c, T) under "kernel", bias "offset", T in "order"
        def __init__(self):
            super().__init__()
            self.order = 4
            self.kernel = nn.Parameter(torch.randn(3, 2, 4, dtype=F64))
            self.offset = nn.Parameter(torch.randn(3, dtype=F64))

        def forward(self, x):
            return fe.reference.naive_eq_linear(x, self.kernel, self.offset, 4)

    model = nn.Sequential(Custom())
    assert fe.swap_eq_linear(copy.deepcopy(model)) == []  # unknown layout: left alone
    fe.register_naive_layout(
        fe.NaiveLayout("custom", weight="kernel", bias="offset", group_size="order", classes=(Custom,))
    )
    fast = copy.deepcopy(model)
    assert fe.swap_eq_linear(fast) == ["0"]
    assert isinstance(fast[0], fe.SwappedEQLinear) and fast[0].kernel is not model[0].kernel
    x = torch.randn(5, 8, dtype=F64)
    with torch.no_grad():
        assert rel_l2(fast(x), model(x)) < 1e-12
    assert list(fast.state_dict()) == list(model.state_dict())


def test_depthwise_conv_is_not_a_naive_layer():
    conv = nn.Conv2d(8, 8, 4, groups=8)  # weight (8, 1, 4, 4), bias (8,): the weight_index shape, no index
    assert not is_naive_eq_linear(conv)
    assert fe.swap_eq_linear(nn.Sequential(conv)) == []


def test_swapped_layer_loads_planes_checkpoints(gen):
    torch.manual_seed(2)
    naive = Mixed(16).double()
    planes = copy.deepcopy(naive)
    fe.swap_eq_linear(planes, params="planes")
    kept = copy.deepcopy(Mixed(16).double())
    fe.swap_eq_linear(kept)
    kept.load_state_dict(planes.state_dict())  # FlashEQLinear's planes, converted on load
    x = torch.randn(4, 16, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(kept(x), naive(x)) < 1e-12


# ---- escnn: pointwise layers between regular fields of C_N (optional dependency) ----


def _escnn_models(N):
    """A C_N CNN of 1x1 R2Convs (with a 3x3 one left alone) and a Linear model, float64."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from escnn import gspaces
        from escnn import nn as enn
    torch.manual_seed(N)
    gs = gspaces.rot2dOnR2(N)
    t1, t2, t3 = (enn.FieldType(gs, [gs.regular_repr] * k) for k in (3, 5, 2))
    cnn = enn.SequentialModule(
        enn.R2Conv(t1, t2, kernel_size=1),
        enn.ReLU(t2),
        enn.R2Conv(t2, t3, kernel_size=1),
        enn.R2Conv(t3, t3, kernel_size=3, padding=1),
    ).double()
    g0 = gspaces.no_base_space(gs.fibergroup)
    u1, u2 = (enn.FieldType(g0, [gs.fibergroup.regular_representation] * k) for k in (4, 3))
    mlp = enn.SequentialModule(enn.Linear(u1, u2), enn.ReLU(u2), enn.Linear(u2, u2)).double()
    for m in (cnn, mlp):
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith("bias"):
                    p.normal_()
    return enn, cnn, mlp


@pytest.mark.parametrize("N", [4, 8])
def test_escnn_pointwise_layers_swapped_keep_parameters_and_training(N, gen, caplog):
    pytest.importorskip("escnn", reason="escnn not installed (pip install flash-eqlinear[escnn])")
    import logging

    enn, cnn, mlp = _escnn_models(N)
    tol = 1e-12 if N == 4 else 1e-6  # C8: escnn's float32-sampled basis
    for model, x in (
        (cnn, torch.randn(2, 3 * N, 5, 5, generator=gen, dtype=F64)),
        (mlp, torch.randn(6, 4 * N, generator=gen, dtype=F64)),
    ):
        fast = copy.deepcopy(model)
        keys = {k: tuple(v.shape) for k, v in fast.state_dict().items()}
        opt_ref = torch.optim.Adam(model.parameters(), lr=1e-2)
        opt = torch.optim.Adam(fast.parameters(), lr=1e-2)  # built before the swap
        with caplog.at_level(logging.INFO, logger="flash_eqlinear"):
            names = fe.swap_eq_linear(fast)
        assert names == (["0", "2"] if model is cnn else ["0", "2"])
        if model is cnn:
            assert "3 (R2Conv) not swapped: not pointwise" in caplog.text
        assert {k: tuple(v.shape) for k, v in fast.state_dict().items()} == keys
        gx = enn.GeometricTensor(x, model.in_type)
        with torch.no_grad():
            assert rel_l2(fast(gx).tensor, model(gx).tensor) < tol
            for e in range(0, N, N // 4):  # the 90-degree rotations: exact on the pixel grid
                g = model.in_type.fibergroup.element(e)
                err = rel_l2(fast(gx.transform(g)).tensor, fast(gx).transform(g).tensor)
                own = rel_l2(model(gx.transform(g)).tensor, model(gx).transform(g).tensor)  # escnn's basis
                assert err <= 2 * own + 1e-12, (err, own)
        steps = 10 if N == 4 else 3
        for _ in range(steps):
            for m, o in ((model, opt_ref), (fast, opt)):
                o.zero_grad()
                m(gx).tensor.square().mean().backward()
                o.step()
        for (name, p), q in zip(model.named_parameters(), fast.parameters(), strict=True):
            assert rel_l2(q, p) < (1e-10 if N == 4 else 1e-5), name
        fast.eval(), model.eval()
        plain = fast.export()  # escnn's export: plain torch layers
        with torch.no_grad():
            assert rel_l2(plain(x), model(gx).tensor) < tol
        assert {k: tuple(v.shape) for k, v in fast.state_dict().items()} == {
            k: tuple(v.shape) for k, v in model.state_dict().items()
        }


def test_swap_is_idempotent_for_both_parametrisations_with_index_buffers(gen):
    """Our fused layers are never taken for naive ones (a planes layer keeps an index buffer)."""
    naive = Mixed(16).double()
    x = torch.randn(3, 16, generator=gen, dtype=F64)
    for params in ("keep", "planes"):
        fast = copy.deepcopy(naive)
        assert len(fe.swap_eq_linear(fast, params=params)) == 3
        assert fe.swap_eq_linear(fast) == [] and fe.swap_eq_linear(fast, params="planes") == []
        with torch.no_grad():
            assert rel_l2(fast(x), naive(x)) < 1e-12


def test_registered_layout_loads_and_converts(gen):
    class Kernel(nn.Module):
        def __init__(self):
            super().__init__()
            self.kern = nn.Parameter(torch.randn(3, 2, 4, dtype=F64))
            self.off = nn.Parameter(torch.randn(3, dtype=F64))

        def forward(self, x):
            return fe.reference.naive_eq_linear(x, self.kern, self.off, 4)

    fe.register_naive_layout(fe.NaiveLayout("kern", weight="kern", bias="off", classes=(Kernel,)))
    model = nn.Sequential(Kernel())
    original = model.state_dict()
    planes = copy.deepcopy(model)
    fe.swap_eq_linear(planes, params="planes")
    planes.load_state_dict(original)  # loads directly
    converted = fe.convert_state_dict(original)
    assert set(converted) == {"0.weight", "0.bias"}
    fresh = copy.deepcopy(model)
    fe.swap_eq_linear(fresh, params="planes")
    fresh.load_state_dict(converted)
    back = fe.naive_state_dict(fresh)  # the layout it came from
    assert set(back) == set(original) and all(rel_l2(back[k], v) < 1e-14 for k, v in original.items())
    x = torch.randn(2, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        assert rel_l2(planes(x), model(x)) < 1e-12 and rel_l2(fresh(x), model(x)) < 1e-12


def test_kept_tensors_made_under_inference_mode_serve_training(gen):
    layer = fe.SwappedEQLinear(RefEQLinear(1024, 1024).double()).eval()  # the Fourier form on CPU
    fe.layouts._BASIS.clear()
    with torch.inference_mode():
        layer(torch.randn(300, 1024, generator=gen, dtype=F64))
    layer.train()
    layer(torch.randn(300, 1024, generator=gen, dtype=F64)).sum().backward()
    assert layer.weights.grad is not None


def test_escnn_swap_changes_nothing_else(gen):
    """The escnn adapter reads escnn's own expansion: no other layer's basis changes dtype, no random number
    is drawn; layers with a filtered basis are left alone."""
    pytest.importorskip("escnn", reason="escnn not installed (pip install flash-eqlinear[escnn])")
    enn, cnn, _ = _escnn_models(4)
    cnn = cnn.float()
    other, fast = copy.deepcopy(cnn), copy.deepcopy(cnn)
    x = enn.GeometricTensor(torch.randn(2, 12, 5, 5, generator=gen), cnn.in_type)
    torch.manual_seed(5)
    expected = torch.rand(1).item()
    torch.manual_seed(5)
    assert fe.swap_eq_linear(fast, include="0") == ["0"]
    with torch.no_grad():
        fast(x), other(x), cnn(x)  # the float32 escnn layers all still run
    assert torch.rand(1).item() == expected  # nothing drawn from the global generator
    filtered = enn.R2Conv(cnn.in_type, cnn.in_type, kernel_size=1, basis_filter=lambda attr: attr["idx"] != 3)
    assert filtered.weights.numel() != 12 * 12 // 4
    assert fe.swap_eq_linear(enn.SequentialModule(filtered)) == []
