"""Misuse raises ValueError / TypeError / RuntimeError with a message that names the problem."""

import pytest
import torch
import torch.nn as nn

import flash_eqlinear as fe
from flash_eqlinear.reference import fourier_eq_linear, naive_eq_linear

LAYERS = [fe.FlashEQLinear, fe.NaiveEQLinear]


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", LAYERS)
def test_in_features_not_divisible(cls):
    with pytest.raises(ValueError, match=r"in_features=10 is not divisible by group_size=4"):
        cls(10, 8, group_size=4)


@pytest.mark.parametrize("cls", LAYERS)
def test_out_features_not_divisible(cls):
    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by group_size=3"):
        cls(6, 10, group_size=3)


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("g", [0, -1])
def test_group_size_not_positive(cls, g):
    with pytest.raises(ValueError, match=rf"group_size must be >= 1, got {g}"):
        cls(8, 8, group_size=g)


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("g, tname", [(4.0, "float"), ("4", "str"), (True, "bool"), (None, "NoneType")])
def test_group_size_not_int(cls, g, tname):
    with pytest.raises(TypeError, match=rf"group_size must be an int, got {tname}"):
        cls(8, 8, group_size=g)


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("n", [0, -4, 8.0])
def test_features_not_positive_int(cls, n):
    with pytest.raises(ValueError, match="in_features must be a positive int"):
        cls(n, 8)
    with pytest.raises(ValueError, match="out_features must be a positive int"):
        cls(8, n)


# ---------------------------------------------------------------------------------------------
# Forward: input checks (modules and functional forms)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", LAYERS)
def test_wrong_last_dim(cls):
    layer = cls(8, 12)
    with pytest.raises(ValueError, match=r"in_features = c\*T = 2\*4 = 8.*\(3, 12\)"):
        layer(torch.randn(3, 12))
    with pytest.raises(ValueError, match=r"= 8.*\(8, 3\)"):
        layer(torch.randn(8, 3))  # transposed input


@pytest.mark.parametrize("cls", LAYERS)
def test_scalar_input(cls):
    with pytest.raises(ValueError, match="in_features"):
        cls(4, 4)(torch.tensor(1.0))


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_input(cls, dtype):
    with pytest.raises(TypeError, match=rf"input must be a floating-point tensor, got dtype {dtype}"):
        cls(8, 8)(torch.ones(2, 8, dtype=dtype))


@pytest.mark.parametrize("cls", LAYERS)
def test_non_tensor_input(cls):
    with pytest.raises(TypeError, match="input must be a torch.Tensor, got list"):
        cls(4, 4)([[1.0, 2.0, 3.0, 4.0]])


@pytest.mark.parametrize("cls", LAYERS)
@pytest.mark.parametrize("xdtype", [torch.float64, torch.float16])
def test_dtype_mismatch(cls, xdtype):
    layer = cls(8, 8)  # float32
    with pytest.raises(
        RuntimeError, match=rf"input dtype {xdtype} does not match weight dtype torch.float32"
    ):
        layer(torch.randn(2, 8).to(xdtype))


@pytest.mark.parametrize("cls", LAYERS)
def test_device_mismatch(cls):
    with pytest.raises(RuntimeError, match=r"input is on meta but weight is on cpu"):
        cls(8, 8)(torch.empty(2, 8, device="meta"))
    with pytest.raises(RuntimeError, match=r"input is on cpu but weight is on meta"):
        cls(8, 8, device="meta")(torch.randn(2, 8))


@pytest.mark.parametrize("f", [fe.flash_eq_linear, fourier_eq_linear])
def test_functional_bias_wrong_shape(f):
    x, planes = torch.randn(2, 12), torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match=r"bias must have shape \(d,\) = \(2,\), got \(8,\)"):
        f(x, planes, torch.randn(8), 4)  # bias repeated per copy: the dense layout, not ours
    with pytest.raises(ValueError, match=r"bias must have shape \(d,\) = \(2,\), got \(2, 1\)"):
        f(x, planes, torch.randn(2, 1), 4)


@pytest.mark.parametrize("f", [fe.flash_eq_linear, fourier_eq_linear])
def test_functional_bias_dtype_device_type(f):
    x, planes = torch.randn(2, 12), torch.randn(4, 2, 3)
    with pytest.raises(RuntimeError, match="bias dtype torch.float64 does not match weight dtype"):
        f(x, planes, torch.randn(2, dtype=torch.float64), 4)
    with pytest.raises(RuntimeError, match="bias is on meta but weight is on cpu"):
        f(x, planes, torch.empty(2, device="meta"), 4)
    with pytest.raises(TypeError, match="bias must be a torch.Tensor or None, got list"):
        f(x, planes, [0.0, 0.0], 4)


def test_naive_bias_wrong_shape():
    with pytest.raises(ValueError, match=r"bias must have shape \(d,\) = \(2,\), got \(3,\)"):
        naive_eq_linear(torch.randn(2, 12), torch.randn(2, 3, 4), torch.randn(3), 4)


@pytest.mark.parametrize("f", [fe.flash_eq_linear, fourier_eq_linear])
def test_planes_wrong_group_size(f):
    with pytest.raises(ValueError, match=r"weight \(3, 2, 3\) holds group size 3 but group_size=4"):
        f(torch.randn(2, 12), torch.randn(3, 2, 3), None, 4)
    with pytest.raises(ValueError, match=r"weight \(4, 2, 3\) holds group size 4 but group_size=3"):
        f(torch.randn(2, 9), torch.randn(4, 2, 3), None, 3)


@pytest.mark.parametrize("f", [fe.flash_eq_linear, fourier_eq_linear])
def test_planes_wrong_rank(f):
    with pytest.raises(ValueError, match=r"weight must have shape \(T, d, c\), got \(8, 12\)"):
        f(torch.randn(2, 12), torch.randn(8, 12), None, 4)


def test_wrong_group_size_names_the_layout_conversion():
    """A group-domain weight passed as planes (and vice versa): the message names the conversion."""
    layer = fe.FlashEQLinear(16, 32)
    with pytest.raises(ValueError, match=r"planes weights are \(T, d, c\).*flash_eqlinear.naive_to_planes"):
        fe.flash_eq_linear(torch.randn(2, 16), layer.naive_weight().detach())
    with pytest.raises(ValueError, match=r"group-domain weights are \(d, c, T\).*planes_to_naive"):
        naive_eq_linear(torch.randn(2, 8), torch.randn(4, 2, 3), None, 4)  # planes (T, d, c) = (4, 2, 3)


def test_non_float_dtype_at_construction():
    for cls in LAYERS:
        for dtype in (torch.complex64, torch.int32, "float32"):
            with pytest.raises(TypeError, match="dtype must be a real floating-point torch.dtype"):
                cls(16, 32, dtype=dtype)


def test_mlp_errors_name_the_layer():
    w1, w2 = torch.randn(4, 8, 4), torch.randn(4, 4, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"second layer \(weight2, bias2.*float32 does not match.*float64"):
        fe.flash_eq_mlp(torch.randn(2, 16), w1, None, w2, None)
    with pytest.raises(ValueError, match=r"first layer \(x, weight1, bias1\).*in_features"):
        fe.flash_eq_mlp(torch.randn(2, 12), w1, None, w2.float(), None)
    with pytest.raises(ValueError, match=r"second layer.*bias must have shape"):
        fe.flash_eq_mlp(torch.randn(2, 16), w1, None, w2.float(), torch.randn(5))


def test_naive_weight_wrong_group_size():
    with pytest.raises(ValueError, match=r"holds group size 4 but group_size=2"):
        naive_eq_linear(torch.randn(2, 6), torch.randn(2, 3, 4), None, 2)
    with pytest.raises(ValueError, match=r"\(d, c, T\) or \(d, 1, c, T\)"):
        naive_eq_linear(torch.randn(2, 6), torch.randn(2, 2, 3, 4), None, 4)


@pytest.mark.parametrize("g, exc", [(0, ValueError), (-1, ValueError), (4.0, TypeError)])
def test_functional_group_size(g, exc):
    with pytest.raises(exc, match="group_size"):
        fe.flash_eq_linear(torch.randn(2, 8), torch.randn(4, 2, 2), None, g)


def test_integer_weight():
    with pytest.raises(TypeError, match="weight must be a floating-point tensor"):
        fe.flash_eq_linear(torch.randn(2, 8), torch.ones(4, 2, 2, dtype=torch.int64), None, 4)


# ---------------------------------------------------------------------------------------------
# Constructors from other layers / weights
# ---------------------------------------------------------------------------------------------


def test_from_linear_wrong_type_and_features():
    with pytest.raises(TypeError, match="expects an nn.Linear, got Conv1d"):
        fe.FlashEQLinear.from_linear(nn.Conv1d(8, 8, 1), group_size=4)
    with pytest.raises(ValueError, match="in_features=6 is not divisible by group_size=4"):
        fe.FlashEQLinear.from_linear(nn.Linear(6, 8), group_size=4)


def test_from_naive_errors():
    with pytest.raises(ValueError, match=r"bias must have shape \(2,\) or \(2, 1\), got \(3,\)"):
        fe.FlashEQLinear.from_naive(torch.randn(2, 3, 4), torch.randn(3))
    with pytest.raises(ValueError, match=r"\(d, c, T\) or \(d, 1, c, T\), got \(6, 4\)"):
        fe.FlashEQLinear.from_naive(torch.randn(6, 4))
    with pytest.raises(TypeError, match="floating point"):
        fe.FlashEQLinear.from_naive(torch.ones(2, 3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fe.FlashEQLinear.from_naive([[[1.0]]])


def test_load_state_dict_wrong_shape():
    sd = fe.FlashEQLinear(8, 12).state_dict()
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        fe.FlashEQLinear(8, 16).load_state_dict(sd)
