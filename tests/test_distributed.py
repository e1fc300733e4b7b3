"""Training on two processes against one: DDP (with ``no_sync`` accumulation), FSDP2 (``fully_shard`` per
layer and on the root) and distributed checkpoints (DCP) from FSDP2 to a one-process model and back, for both
parametrisations (FlashEQLinear's planes; SwappedEQLinear keeping a naive layer's parameters) and an EQ-ViT.

The test starts two processes itself: on two CUDA GPUs with NCCL where a machine has them, else on the CPU
with gloo (the same code above the kernels; the GPUs add the kernels and NCCL). Every rank also computes the
one-process run on the whole global batch, so each comparison is local. FP32: equal up to reduction order.
AdamW for the layers; SGD with momentum for the ViT, whose attention's key bias has a gradient of zero in
exact arithmetic, which Adam turns from rounding noise into full-size steps that differ between runs.
"""

from __future__ import annotations

import copy
import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from conftest import RefEQLinear, rel_l2

import flash_eqlinear as fe

WORLD = 2
TOL = 1e-5  # FP32, reductions in another order
STEPS = 3


def _models(device):
    """name -> a one-process model (FP32), built alike on every rank."""
    torch.manual_seed(0)
    planes = nn.Sequential(fe.FlashEQLinear(16, 64), nn.GELU(), fe.FlashEQLinear(64, 16))
    keep = nn.Sequential(RefEQLinear(16, 64, 4), nn.GELU(), fe.NaiveEQLinear(64, 16, group_size=4))
    fe.swap_eq_linear(keep)  # SwappedEQLinear: the naive parameters
    from flash_eqlinear.models import eq_vit

    vit = eq_vit(None, "flash", num_classes=10, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    return {"planes": planes.to(device), "keep": keep.to(device), "vit": vit.to(device)}


def _batch(name, device, rows=8):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 3, 32, 32, generator=g) if name == "vit" else torch.randn(rows, 16, generator=g)
    return x.to(device)


def _loss(model, x):
    return model(x).float().square().mean()


def _optimizer(name, model):
    if name == "vit":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train(model, batches, opt):
    for x in batches:
        opt.zero_grad()
        _loss(model, x).backward()
        opt.step()


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _same_params(a, b, what):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        err = rel_l2(_full(q.detach()).cpu(), p.detach().cpu())
        assert err < TOL, f"{what}: {name} differs by {err:.2e}"


def _ddp(rank, device, name, model):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref, mine = (
        copy.deepcopy(model),
        DDP(copy.deepcopy(model), device_ids=[rank] if device.type == "cuda" else None),
    )
    x = _batch(name, device)
    local = x.chunk(WORLD)[rank]
    _train(ref, [x] * STEPS, _optimizer(name, ref))
    _train(mine, [local] * STEPS, _optimizer(name, mine))
    _same_params(ref, mine.module, f"DDP {name}")
    # gradient accumulation: two micro-batches per rank, the first under no_sync
    ref, mine = (
        copy.deepcopy(model),
        DDP(copy.deepcopy(model), device_ids=[rank] if device.type == "cuda" else None),
    )
    _loss(ref, x).backward()
    with mine.no_sync():
        (_loss(mine, local.chunk(2)[0]) / 2).backward()
    (_loss(mine, local.chunk(2)[1]) / 2).backward()
    for (pname, p), q in zip(ref.named_parameters(), mine.module.parameters(), strict=True):
        assert rel_l2(q.grad.cpu(), p.grad.cpu()) < TOL, f"DDP no_sync {name}: {pname}"


def _fsdp(rank, device, name, model, tmp):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    def sharded(m):
        for sub in m.modules():
            if isinstance(sub, (fe.FlashEQLinear, fe.SwappedEQLinear)):
                fully_shard(sub)
        return fully_shard(m)

    ref, mine = copy.deepcopy(model), sharded(copy.deepcopy(model))
    x = _batch(name, device)
    _train(ref, [x] * STEPS, _optimizer(name, ref))
    _train(mine, [x.chunk(WORLD)[rank]] * STEPS, _optimizer(name, mine))
    _same_params(ref, mine, f"FSDP2 {name}")
    # DCP: FSDP2's sharded state -> a one-process model, and a one-process checkpoint -> a new FSDP2 model
    path = os.path.join(tmp, f"{name}_fsdp")
    dcp.save({"model": get_model_state_dict(mine)}, checkpoint_id=path)
    plain = copy.deepcopy(model)
    sd = {"model": plain.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    plain.load_state_dict(sd["model"])
    _same_params(ref, plain, f"DCP FSDP2 -> one process, {name}")
    path = os.path.join(tmp, f"{name}_plain")
    dcp.save({"model": plain.state_dict()}, checkpoint_id=path)
    again = sharded(copy.deepcopy(model))
    sd = {"model": get_model_state_dict(again)}
    dcp.load(sd, checkpoint_id=path)
    set_model_state_dict(again, sd["model"])
    _same_params(ref, again, f"DCP one process -> FSDP2, {name}")


def _ddp_compiled_autocast(rank, device, name, model):
    """A torch.compile'd DDP model under bf16 autocast against one eager process: losses and parameters
    within what bf16 allows."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [rank] if device.type == "cuda" else None
    ref, mine = copy.deepcopy(model), torch.compile(DDP(copy.deepcopy(model), device_ids=ids))
    x = _batch(name, device)
    opts = _optimizer(name, ref), _optimizer(name, mine)
    for _ in range(STEPS):
        losses = []
        for m, opt, batch in ((ref, opts[0], x), (mine, opts[1], x.chunk(WORLD)[rank])):
            opt.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = _loss(m, batch)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        total = losses[1].clone()
        dist.all_reduce(total)
        assert abs(total.item() / WORLD - losses[0].item()) <= 2e-2 * abs(losses[0].item()), (name, losses)
    for (pname, p), q in zip(ref.named_parameters(), mine.module.parameters(), strict=True):
        assert rel_l2(q.detach().cpu(), p.detach().cpu()) < 2e-2, f"compiled DDP bf16 {name}: {pname}"


def _run_all(rank, device, tmp):
    for name, model in _models(device).items():
        _ddp(rank, device, name, model)
        _fsdp(rank, device, name, model, tmp)


def _run_compiled(rank, device, tmp):
    models = _models(device)
    for name in ("planes", "keep"):
        _ddp_compiled_autocast(rank, device, name, models[name])


def _worker(rank, device_type, port, tmp, queue, scenario):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    backend = "nccl" if device_type == "cuda" else "gloo"
    try:
        if device_type == "cuda":
            torch.cuda.set_device(rank)
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        dist.init_process_group(backend, rank=rank, world_size=WORLD)
        scenario(rank, device, tmp)
        dist.barrier()  # both done with their collectives before the group goes
        queue.put((rank, None))
    except BaseException:
        queue.put((rank, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(scenario, tmp):
    device_type = "cuda" if torch.cuda.device_count() >= WORLD and dist.is_nccl_available() else "cpu"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, device_type, port, str(tmp), queue, scenario))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    try:  # a hung collective fails the test instead of the whole run
        results = dict(queue.get(timeout=300) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    failures = {r: tb for r, tb in results.items() if tb}
    assert not failures, "\n".join(f"rank {r}:\n{tb}" for r, tb in failures.items())


needs_dist = pytest.mark.skipif(
    not dist.is_available(), reason="torch.distributed is not available in this build"
)


@needs_dist
def test_ddp_fsdp2_and_dcp_match_one_process(tmp_path):
    _spawn(_run_all, tmp_path)


@needs_dist
@pytest.mark.slow  # (compiles in each process)
def test_compiled_ddp_under_bf16_autocast(tmp_path):
    _spawn(_run_compiled, tmp_path)


@needs_dist
@pytest.mark.slow  # (six short runs of the example)
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_example_resumes_to_the_uninterrupted_loss(mode, tmp_path):
    """examples/train.py under torchrun on two processes: a run stopped at step 2 and resumed from its
    checkpoint ends with the loss of an uninterrupted run."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "train.py"
    # --standalone: a local rendezvous on a free port of its own
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD)]
    args = [str(script), "--dist", mode, "--scale", "tiny", "--batch", "4", "--classes", "10"]

    def final(*extra):
        res = subprocess.run([*torchrun, *args, *extra], capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stdout + res.stderr
        return [line for line in res.stdout.splitlines() if line.startswith("final loss")][-1]

    whole = final("--steps", "4")
    final("--steps", "2", "--ckpt-dir", str(tmp_path))
    assert final("--steps", "4", "--ckpt-dir", str(tmp_path)) == whole
