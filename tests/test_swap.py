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
    names = fe.swap_eq_linear(model)
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
    assert len(fe.swap_eq_linear(model)) == len(EQ_NAMES)
    assert fe.swap_eq_linear(model) == []


def test_swap_include_globs(gen):
    model = _model()
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    names = fe.swap_eq_linear(model, include=["blocks.*.mlp.*", "stem"])
    assert sorted(names) == sorted(EQ_NAMES[:5])
    assert isinstance(model.heads["a"], fe.NaiveEQLinear) and isinstance(model.heads["b"], RefEQLinear)
    assert isinstance(model.blocks[1].mlp[2], fe.FlashEQLinear)
    with torch.no_grad():
        assert rel_l2(model(x), before) < 1e-13


def test_swap_include_single_glob_string():
    model = _model()
    assert fe.swap_eq_linear(model, include="heads.*") == ["heads.a", "heads.b"]


def test_swap_include_predicate():
    model = _model()
    seen = []

    def pred(name, module):
        seen.append(name)
        return isinstance(module, RefEQLinear)

    names = fe.swap_eq_linear(model, include=pred)
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
    fe.swap_eq_linear(model)
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
    fe.swap_eq_linear(model)
    assert all(p.dtype == dtype for p in model.parameters())


def test_swap_root_and_non_module():
    layer = fe.NaiveEQLinear(8, 8)
    with pytest.raises(ValueError, match="itself a naive EQ-Linear.*from_naive"):
        fe.swap_eq_linear(layer)  # the root itself cannot be replaced in place
    assert fe.swap_eq_linear(layer, include="blocks.*") == []  # not selected: nothing to do
    assert isinstance(layer, fe.NaiveEQLinear)
    with pytest.raises(TypeError, match="nn.Module"):
        fe.swap_eq_linear({"a": layer})


def test_swap_shared_layer_replaced_everywhere(gen):
    shared = fe.NaiveEQLinear(8, 8, dtype=F64)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    x = torch.randn(3, 8, generator=gen, dtype=F64)
    with torch.no_grad():
        before = model(x)
    fe.swap_eq_linear(model)
    assert isinstance(model[0], fe.FlashEQLinear) and model[2] is model[0]  # still shared
    with torch.no_grad():
        assert rel_l2(model(x), before) < 1e-13


def test_swap_shared_layer_selected_under_one_name(gen):
    """``include`` naming one of a shared layer's names replaces it under all of them (tying kept)."""
    shared = fe.NaiveEQLinear(8, 8, dtype=F64)
    model = nn.Module()
    model.a, model.b, model.other = shared, shared, fe.NaiveEQLinear(8, 8, dtype=F64)
    assert fe.swap_eq_linear(model, include="a") == ["a", "b"]
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
    fe.swap_eq_linear(fresh)
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
    fe.swap_eq_linear(model)
    model.load_state_dict(new)
    with torch.no_grad():
        assert rel_l2(model(x), before) < 1e-13
    # a converted checkpoint is not converted again
    again = fe.convert_state_dict(new)
    torch.testing.assert_close(again["0.weight"], new["0.weight"], rtol=0, atol=0)


def test_swapped_model_state_dict_round_trip(gen):
    model = _model()
    fe.swap_eq_linear(model)
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
