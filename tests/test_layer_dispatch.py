"""The module's call structure on the fused path, checked on any machine: an eager FlashEQLinear forward (and
forward_chunks, and the models' MLP in training) is one call of the layer op, issuing no tensor op of its
own from Python (casts, checks and reshapes run inside the op, in C++). The op is replaced by a recording
stand-in and the device test by True; the real op's behaviour is tested in test_layer_op_cuda.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import flash_eqlinear as fe
from flash_eqlinear import modules, ops


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
