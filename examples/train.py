"""Train an EQ-ViT on one or several GPUs: bf16 autocast, AdamW, distributed checkpoints, resume.

  python examples/train.py                                          # one GPU (or the CPU)
  torchrun --nproc_per_node 2 examples/train.py --dist ddp           # two GPUs, DistributedDataParallel
  torchrun --nproc_per_node 2 examples/train.py --dist fsdp          # two GPUs, FSDP2 (fully_shard per block)
  python examples/train.py --scale tiny --steps 20 --ckpt-dir /tmp/run   # a small run on the CPU

The data is synthetic and made where it is used (no downloads): the global batch of step i comes from a
generator seeded with (seed, i), and each process takes its share, so a run is the same on any number of
processes up to reduction order, and a resumed run is the same as an uninterrupted one. ``--variant swapped``
builds the naive model and swaps its layers (``flash_eqlinear.swap_eq_linear``: the naive parameters kept),
as a user does with a model of their own. Every ``--ckpt-every`` steps the model and optimizer state go to
``--ckpt-dir`` through ``torch.distributed.checkpoint`` (sharded under FSDP2); a run finding a checkpoint
there resumes from it. Prints a progress line every ``--log-every`` steps, the throughput (images/s of all
processes over the steps after ``--warmup``) and the last step's loss.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package from the repository root
import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear.models import eq_vit  # noqa: E402

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)  # --scale tiny


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="S", help="T, S, B, L, H, or tiny (a small config for the CPU)")
    ap.add_argument("--variant", default="flash", choices=("flash", "swapped", "naive", "plain"))
    ap.add_argument("--group-size", type=int, default=4, help="4 (p4) or 8 (C8: 45-degree rotations)")
    ap.add_argument("--dist", default="none", choices=("none", "ddp", "fsdp"), help="under torchrun")
    ap.add_argument("--batch", type=int, default=64, help="images per process and step")
    ap.add_argument("--steps", type=int, default=100, help="the step to stop at (a resumed run continues)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--ckpt-dir", default=None, help="checkpoints here; resumes from the latest one")
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10, help="progress line every N steps (each one a sync)")
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the images/s figure")
    return ap.parse_args(argv)


def build(args, device) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    config = TINY if args.scale == "tiny" else {}
    scale = None if args.scale == "tiny" else args.scale
    variant = "naive" if args.variant == "swapped" else args.variant
    model = eq_vit(scale, variant, num_classes=args.classes, group_size=args.group_size, **config).to(device)
    if args.variant == "swapped":
        fe.swap_eq_linear(model)
    return model


def batch(args, step: int, img: int, device, rank: int, world: int):
    """Process ``rank``'s share of step ``step``'s global batch (images, labels), alike on any world size.

    Made on the device (a generator there, seeded per step): drawing the images on the host would cost
    more than the step of a small model."""
    g = torch.Generator(device).manual_seed(args.seed * 1_000_003 + step)
    n = args.batch * world
    x = torch.randn(n, 3, img, img, generator=g, device=device)
    y = torch.randint(0, args.classes, (n,), generator=g, device=device)
    share = slice(rank * args.batch, (rank + 1) * args.batch)
    return x[share], y[share]


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def latest(ckpt_dir: str | None) -> tuple[int, str | None]:
    """(step, path) of the newest complete checkpoint, or (0, None)."""
    marker = Path(ckpt_dir or "", "latest")
    if not ckpt_dir or not marker.exists():
        return 0, None
    step = int(marker.read_text())
    return step, str(Path(ckpt_dir, f"step_{step}"))


def save(model, opt, step: int, args, rank: int) -> None:
    model_sd, opt_sd = get_state_dict(model, opt)
    path = Path(args.ckpt_dir, f"step_{step}")
    dcp.save({"model": model_sd, "optim": opt_sd}, checkpoint_id=str(path))
    if dist.is_initialized():
        dist.barrier()  # every shard written before the marker names the checkpoint
    if rank == 0:
        tmp = Path(args.ckpt_dir, "latest.tmp")
        tmp.write_text(str(step))
        os.replace(tmp, Path(args.ckpt_dir, "latest"))


def main(argv=None) -> int:
    args = parse(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.dist != "none" and world == 1 and "RANK" not in os.environ:
        print("--dist ddp / fsdp run under torchrun (torchrun --nproc_per_node N examples/train.py ...)")
        return 2
    cuda = torch.cuda.is_available()
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.dist != "none":
        dist.init_process_group("nccl" if cuda else "gloo")
    model = build(args, device)
    img = TINY["img_size"] if args.scale == "tiny" else 224  # (eq_vit's default image size)
    if args.dist == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
    elif args.dist == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    # (fused: one kernel per parameter group and step; the default foreach form costs more host time)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, fused=cuda)
    step, path = latest(args.ckpt_dir)
    if path is not None:
        model_sd, opt_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": opt_sd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if rank == 0:
            print(f"resumed from {path} (step {step})")
    run = torch.compile(model) if args.compile else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    t0, timed, loss = None, 0, None

    def images_per_s() -> float:  # all processes' images since the clock started
        return timed * args.batch * world / (time.perf_counter() - t0)

    first = step
    while step < args.steps:
        if step - first == min(args.warmup, args.steps - first - 1):  # the clock starts after the warm-up
            sync(device)
            t0, timed = time.perf_counter(), 0
        x, y = batch(args, step, img, device, rank, world)
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = F.cross_entropy(run(x).float(), y)
        loss.backward()
        opt.step()
        step, timed = step + 1, timed + 1
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            rate = "warming up" if t0 is None else f"{images_per_s():.1f} images/s"
            print(f"\rstep {step}/{args.steps}  loss {loss.item():.4f}  {rate}", end="", flush=True)
        if args.ckpt_dir and (step % args.ckpt_every == 0 or step == args.steps):
            save(model, opt, step, args, rank)
    if t0 is not None:
        sync(device)
        if rank == 0:  # images of all processes per second, over the steps after the warm-up
            print(f"\nthroughput {images_per_s():.1f} images/s")
    if loss is not None:
        if dist.is_initialized():  # the global batch's loss: the mean of the processes' equal shares
            dist.all_reduce(loss := loss.detach().clone())
            loss /= world
        if rank == 0:
            print(f"final loss {loss.item():.6f}")
    if dist.is_initialized():
        dist.barrier()  # every process done with its collectives, and DDP's reducer gone, before the group
        del run, model, opt
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
