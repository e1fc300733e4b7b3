"""The command-line tools, end to end through files: checkpoint conversion and the self-check."""

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
    assert main([str(src), str(tmp_path / "h.pth"), "--key", "weights_ema", "--only", "fc9"]) == 0
    assert "warning: only: no entries under ['fc9']" in capsys.readouterr().err
    torch.save({"step": torch.zeros(1)}, tmp_path / "plain.pth")
    assert main([str(tmp_path / "plain.pth"), str(tmp_path / "i.pth")]) == 0
    assert "no naive EQ-Linear entries found" in capsys.readouterr().out


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
