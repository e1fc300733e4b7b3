"""The command-line tools, end to end through files: checkpoint conversion and the self-check."""

import errno
import os
import random
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from conftest import RefEQLinear, rel_l2

import flash_eqlinear as fe
from flash_eqlinear.convert import convert_checkpoint, main

F64 = torch.float64


def _model():
    torch.manual_seed(7)
    return nn.Sequential(
        RefEQLinear(8, 16, 4),
        nn.ReLU(),
        fe.NaiveEQLinear(16, 16, group_size=4),  # T = d = c = 4: shapes coincide with planes'
        nn.Linear(16, 5),
    ).double()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "flash_eqlinear.convert", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("container", ["bare", "model", "state_dict"])
def test_cli_converts_checkpoint(container, tmp_path):
    model = _model()
    x = torch.randn(4, 8, dtype=F64)
    with torch.no_grad():
        before = model(x)
    sd = model.state_dict()
    ckpt = {"bare": sd, "model": {"model": sd, "epoch": 3}, "state_dict": {"state_dict": sd, "lr": 0.5}}
    src, dst = tmp_path / "in.pth", tmp_path / "out.pth"
    torch.save(ckpt[container], src)

    res = _cli(src, dst)
    assert res.returncode == 0, res.stderr
    assert "converted 2 EQ-Linear layer(s)" in res.stdout
    assert "  0\n" in res.stdout and "  2\n" in res.stdout

    out = torch.load(dst, weights_only=True)
    if container == "bare":
        new = out
    elif container == "model":
        assert out["epoch"] == 3 and set(out) == {"model", "epoch"}
        new = out["model"]
    else:
        assert out["lr"] == 0.5 and set(out) == {"state_dict", "lr"}
        new = out["state_dict"]
    assert "0.weights" not in new and new["0.weight"].shape == (4, 4, 2)

    fresh = _model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fe.swap_eq_linear(fresh)
    fresh.load_state_dict(new)
    with torch.no_grad():
        assert rel_l2(fresh(x), before) < 1e-13


def test_cli_rejects_non_checkpoint(tmp_path):
    src = tmp_path / "notes.pth"
    src.write_text("this is not a checkpoint\n")
    res = _cli(src, tmp_path / "out.pth")
    assert res.returncode == 2
    assert "cannot load" in res.stderr and str(src) in res.stderr
    assert not (tmp_path / "out.pth").exists()


def test_cli_rejects_checkpoint_without_state_dict(tmp_path):
    src = tmp_path / "list.pth"
    torch.save({"epoch": 3, "history": [1.0, 2.0]}, src)
    res = _cli(src, tmp_path / "out.pth")
    assert res.returncode == 2
    assert "no state_dict found" in res.stderr and "--key" in res.stderr


def test_main_in_process_key_and_errors(tmp_path, capsys):
    sd = _model().state_dict()
    src = tmp_path / "in.pth"
    torch.save({"weights_ema": sd, "step": 10}, src)
    assert main([str(src), str(tmp_path / "a.pth")]) == 2  # unknown container key: not guessed
    assert "no state_dict found" in capsys.readouterr().err
    assert main([str(src), str(tmp_path / "b.pth"), "--key", "weights_ema"]) == 0
    out = torch.load(tmp_path / "b.pth", weights_only=True)
    assert out["step"] == 10 and "0.weight" in out["weights_ema"]
    assert main([str(src), str(tmp_path / "c.pth"), "--key", "missing"]) == 2
    assert "no key 'missing'" in capsys.readouterr().err
    assert main([str(src), str(tmp_path / "d.pth"), "--key", "step"]) == 2
    assert "not a state_dict" in capsys.readouterr().err
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    assert main([str(tmp_path / "list.pth"), str(tmp_path / "e.pth")]) == 2
    assert "not a dict" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.pth"), str(tmp_path / "f.pth")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "--trust" not in err
    assert main([str(src), str(tmp_path / "no_dir" / "g.pth"), "--key", "weights_ema"]) == 2
    assert "cannot write" in capsys.readouterr().err
    assert main([str(src), str(tmp_path / "h.pth"), "--key", "weights_ema", "--only", "fc9"]) == 2
    assert "no naive EQ-Linear layer matches 'fc9'" in capsys.readouterr().err
    assert not (tmp_path / "h.pth").exists()
    torch.save({"step": torch.zeros(1)}, tmp_path / "plain.pth")
    assert main([str(tmp_path / "plain.pth"), str(tmp_path / "i.pth")]) == 0
    assert "no naive EQ-Linear entries found" in capsys.readouterr().out


class _RunConfig:  # a custom object saved beside the weights, as training scripts do
    def __init__(self, lr):
        self.lr = lr


def test_pickled_object_needs_trust(tmp_path, capsys):
    src, dst = tmp_path / "in.pth", tmp_path / "out.pth"
    torch.save({"model": _model().state_dict(), "config": _RunConfig(0.25)}, src)
    assert main([str(src), str(dst)]) == 2
    err = capsys.readouterr().err
    assert "_RunConfig" in err and "pickled Python object" in err and "--trust" in err
    assert "In PyTorch 2.6" not in err and "add_safe_globals" not in err  # not torch's advice to developers
    assert not dst.exists()
    assert main([str(src), str(dst), "--trust"]) == 0
    assert "converted 2 EQ-Linear layer(s)" in capsys.readouterr().out
    out = torch.load(dst, weights_only=False)
    assert out["config"].lr == 0.25 and "0.weight" in out["model"] and "0.weights" not in out["model"]


def _bad_file(kind, path):
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":  # a checkpoint cut short, as by a full disk or an interrupted copy
        torch.save(_model().state_dict(), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif kind == "truncated_legacy":
        torch.save(_model().state_dict(), path, _use_new_zipfile_serialization=False)
        path.write_bytes(path.read_bytes()[:-10])
    else:
        path.write_bytes(random.Random(0).randbytes(4096))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("empty", "the file is empty"),
        ("truncated", "the file is truncated or corrupt"),
        ("truncated_legacy", "the file is truncated or corrupt"),
        ("random", "not a PyTorch checkpoint, or a corrupt one"),
    ],
)
def test_load_errors_are_clear(kind, message, tmp_path, capsys):
    src, dst = tmp_path / "in.pth", tmp_path / "out.pth"
    _bad_file(kind, src)
    for trust in ([], ["--trust"]):
        assert main([str(src), str(dst), *trust]) == 2
        err = capsys.readouterr().err
        assert f"error: cannot load {src}: {message}" in err, err
        assert "--trust" not in err and "Errno" not in err and "In PyTorch 2.6" not in err
        assert not dst.exists()


def _broken_save(obj, f, *args, **kwargs):
    """torch.save that dies halfway through: some bytes written, then a full disk."""
    if isinstance(f, (str, os.PathLike)):
        f = open(f, "wb")  # left open, like a process killed mid-write
    f.write(b"PK\x03\x04 half a checkpoint")
    f.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _interrupted_save(obj, f, *args, **kwargs):
    if isinstance(f, (str, os.PathLike)):
        f = open(f, "wb")
    f.write(b"PK\x03\x04 half a checkpoint")
    f.flush()
    raise KeyboardInterrupt


def _broken_replace(src, dst, *args, **kwargs):
    raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize("failure", ["save", "interrupt", "replace"])
@pytest.mark.parametrize("target", ["in_place", "new", "existing"])
def test_failed_write_changes_no_file(target, failure, tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.pth"
    torch.save({"model": _model().state_dict(), "epoch": 3}, src)
    dst = {"in_place": src, "new": tmp_path / "out.pth", "existing": tmp_path / "old_out.pth"}[target]
    if target == "existing":
        dst.write_bytes(b"a previous output")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    if failure == "replace":
        monkeypatch.setattr(os, "replace", _broken_replace)
    else:
        monkeypatch.setattr(torch, "save", _broken_save if failure == "save" else _interrupted_save)
    if failure == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            main([str(src), str(dst)])
    else:
        assert main([str(src), str(dst)]) == 2
        err = capsys.readouterr().err
        assert f"cannot write {dst}" in err and "nothing written" in err
        assert os.strerror(errno.ENOSPC if failure == "save" else errno.EIO) in err
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # input and any previous output byte for byte; no partial output, no temp file


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, torch.complex128])
def test_refuses_non_real_float_weights(dtype, tmp_path, capsys):
    sd = _model().state_dict()
    sd["0.weights"] = (sd["0.weights"] * 10).to(dtype)
    src, dst = tmp_path / "in.pth", tmp_path / "out.pth"
    torch.save(sd, src)
    assert main([str(src), str(dst)]) == 2
    err = capsys.readouterr().err
    assert f"0.weights ({dtype})" in err and "real floating point" in err and "nothing written" in err
    assert not dst.exists()
    assert main([str(src), str(dst), "--only", "2"]) == 0  # the layer left out: converts
    out = torch.load(dst, weights_only=True)
    assert out["0.weights"].dtype == dtype and "2.weight" in out


def _block():
    mlp = nn.ModuleDict({"fc1": RefEQLinear(8, 16), "fc2": RefEQLinear(16, 8)})
    return nn.ModuleDict({"attn": RefEQLinear(8, 8), "mlp": mlp})


def _blocks_model():
    torch.manual_seed(3)
    return nn.ModuleDict({"blocks": nn.ModuleList([_block(), _block()]), "head": RefEQLinear(8, 8)})


MLP = ["blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"]


@pytest.mark.parametrize(
    "only, converted",
    [
        (["blocks.*.mlp.*"], MLP),
        (["head,blocks.1.attn"], ["blocks.1.attn", "head"]),
        (["head", "blocks.0.*"], ["blocks.0.attn", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "head"]),
        (["*.fc?, head", "blocks.*.mlp.fc1"], [*MLP, "head"]),
    ],
)
def test_only_glob_patterns_in_place(only, converted, tmp_path, capsys):
    path = tmp_path / "ckpt.pth"
    torch.save(_blocks_model().state_dict(), path)
    os.chmod(path, 0o640)
    args = [a for p in only for a in ("--only", p)]
    assert main([str(path), str(path), *args]) == 0  # in place
    assert f"converted {len(converted)} EQ-Linear layer(s)" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pth"]  # no temporary file left
    assert os.stat(path).st_mode & 0o777 == 0o640  # the replaced file keeps its permissions
    out = torch.load(path, weights_only=True)
    layers = sorted({k.rsplit(".", 1)[0] for k in out})
    assert sorted(n for n in layers if n + ".weight" in out) == converted
    assert all(n + ".weights" in out for n in layers if n not in converted)


def test_only_converts_each_chosen_layer_once(monkeypatch):
    """--only matches the checkpoint's layer names before converting: each chosen layer is converted once,
    the others not at all."""
    import flash_eqlinear.modules as modules

    calls = []
    real = modules._to_layout
    monkeypatch.setattr(modules, "_to_layout", lambda w, *a, **k: calls.append(w.shape) or real(w, *a, **k))
    sd = _blocks_model().state_dict()
    out, names = convert_checkpoint(sd, only="blocks.*.mlp.*")
    assert names == MLP and len(calls) == len(MLP)
    calls.clear()
    out, names = convert_checkpoint(sd)
    assert len(names) == 7 and len(calls) == 7  # every layer, once


def test_only_pattern_matching_nothing_fails(tmp_path, capsys):
    src, dst = tmp_path / "in.pth", tmp_path / "out.pth"
    torch.save({"model": _blocks_model().state_dict()}, src)
    code = main([str(src), str(dst), "--only", "blocks.*.mlp.*,blocks.*.ffn.*", "--only", "fc2"])
    assert code == 2
    err = capsys.readouterr().err
    assert (
        "no naive EQ-Linear layer matches 'blocks.*.ffn.*', 'fc2'" in err and "'blocks.*.mlp.*'," not in err
    )
    assert "blocks.0.mlp.fc1" in err and "nothing written" in err  # the layers there are, to choose from
    assert not dst.exists()


def test_convert_checkpoint_keeps_other_entries():
    sd = _model().state_dict()
    ckpt = {"model": sd, "epoch": 3, "optimizer": {"state": {}}}
    out, names = convert_checkpoint(ckpt)
    assert sorted(names) == ["0", "2"]
    assert out["epoch"] == 3 and out["optimizer"] is ckpt["optimizer"]
    assert "0.weights" in ckpt["model"]  # input untouched


def test_selfcheck_cli_runs_on_cpu():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "flash_eqlinear",
            "--device",
            "cpu",
            "--rows",
            "256",
            "--channels",
            "64",
            "--iters",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("flash-eqlinear on CPU: M = 256 rows, C = D = 64")  # printed first
    assert "path: pure PyTorch, dense form" in res.stdout  # C = 64: the dense form on the CPU
    assert "the same dense computation" in res.stdout
    assert res.stdout.count(" ok") == 4 and "min-max" in res.stdout
    assert lines[-1].startswith("verdict: checks passed; FlashEQLinear runs at")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--channels", "510"], "C = 510 (--channels) must be a multiple of the group size 4"),
        (["--group-size", "0"], "--group-size must be at least 1"),
        (["--rows", "0"], "--rows must be at least 1"),
        (["--device", "foo"], "--device"),
    ],
)
def test_selfcheck_cli_argument_errors(args, message, capsys):
    from flash_eqlinear.__main__ import main as selfcheck

    with pytest.raises(SystemExit) as e:
        selfcheck(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_cli_exports_back_to_the_naive_layouts(tmp_path, capsys):
    """A planes-swapped model's checkpoint, converted with --to naive, loads into the original model (strict)
    with the same values; a naive checkpoint converted to planes and back is the original to rounding."""
    model = _model()
    original = model.state_dict()
    swapped = _model()
    fe.swap_eq_linear(swapped, params="planes")
    swapped.load_state_dict(original)
    src, dst = tmp_path / "planes.pth", tmp_path / "naive.pth"
    torch.save({"model": swapped.state_dict(), "step": 9}, src)
    assert main([str(src), str(dst), "--to", "naive"]) == 0
    assert "converted 2 EQ-Linear layer(s)" in capsys.readouterr().out
    out = torch.load(dst, weights_only=True)
    assert out["step"] == 9
    restored = nn.Sequential(
        RefEQLinear(8, 16, 4), nn.ReLU(), fe.NaiveEQLinear(16, 16, group_size=4), nn.Linear(16, 5)
    ).double()
    restored.load_state_dict(out["model"])
    for k, v in original.items():
        assert out["model"][k].shape == v.shape and rel_l2(out["model"][k], v) < 1e-14, k
    there, back = tmp_path / "there.pth", tmp_path / "back.pth"
    torch.save(original, src)
    assert main([str(src), str(there)]) == 0 and main([str(there), str(back), "--to", "naive"]) == 0
    back_sd = torch.load(back, weights_only=True)
    assert set(back_sd) - {"0.weights", "0.c"} == set(original) - {
        "0.weights",
        "0.c",
    }  # (0: as NaiveEQLinear)
    x = torch.randn(3, 8, dtype=F64)
    with torch.no_grad():
        assert rel_l2(restored(x), model(x)) < 1e-13
    assert main([str(src), str(dst), "--to", "naive", "--only", "0"]) == 2


def test_refuses_non_float_weights_of_a_registered_layout():
    """The dtype check finds a layer's naive weight as the conversion does, in any registered layout."""

    class Kern(nn.Module):
        def __init__(self):
            super().__init__()
            self.kern = nn.Parameter(torch.randn(3, 2, 4))
            self.off = nn.Parameter(torch.randn(3))

    fe.register_naive_layout(fe.NaiveLayout("kern_convert", weight="kern", bias="off", classes=(Kern,)))
    sd = {"0.kern": torch.ones(3, 2, 4, dtype=torch.int64), "0.off": torch.zeros(3)}
    with pytest.raises(TypeError, match=r"0\.kern \(torch\.int64\)"):
        convert_checkpoint(sd)
