"""A small DDP training script, as a user runs it under torchrun, that survives a crashed rank by
torchrun's elastic restart: every step ends with a checkpoint (model, optimiser, losses so far),
and a restarted job resumes from the last one.

    torchrun --nproc-per-node 4 --max-restarts 1 train_ddp.py --checkpoint-dir /tmp/ckpt
    hccl-sim chaos --script train_ddp.py --nproc 4 --max-restarts 1 -n 50 --args "--checkpoint-dir /tmp/ckpt"

Apart from the backend's name, the only hccl-sim call is `hccl_sim.torch.report`: each rank's
losses and final parameters, which a fault suite compares with the fault-free run's. A resumed
run gives the same numbers up to float rounding: each step's batch comes from a generator seeded
by the step, and the checkpoint holds the optimiser's momentum too (the rounding: the restart's
first step has DDP's first-iteration gradient buckets, whose sums may run in another order). Without --checkpoint-dir a crash
ends the job (a clean error, the fault named). `--model-only` is the bug a fault suite finds: a
checkpoint without the optimiser's state resumes with no momentum, and the losses drift from the
fault-free run's only when a crash made the job resume.
"""
import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccl_sim.torch


def batch(step, world):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8 * world, 16, generator=g), torch.randint(0, 4, (8 * world,), generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--checkpoint-dir", default=None,
                    help="resume from and save to this directory (one per job: the run id of torchrun names it)")
    ap.add_argument("--model-only", action="store_true",
                    help="the bug: checkpoint the model but not the optimiser (a resumed run loses its momentum)")
    args = ap.parse_args()
    dist.init_process_group("hccl_sim")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, start = [], 0
    ckpt = None
    if args.checkpoint_dir:
        ckpt = Path(args.checkpoint_dir) / os.environ.get("TORCHELASTIC_RUN_ID", "job") / "last.pt"
        if ckpt.exists():
            state = torch.load(ckpt)
            model.module.load_state_dict(state["model"])
            if "opt" in state:
                opt.load_state_dict(state["opt"])
            losses, start = state["losses"], state["step"] + 1
    for step in range(start, args.steps):
        x, y = batch(step, world)
        mine = slice(rank * 8, rank * 8 + 8)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[mine]), y[mine])
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
        if ckpt is not None:
            dist.barrier()                     # every rank has stepped: the checkpoint is of a whole step
            if rank == 0:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                tmp = ckpt.with_suffix(".tmp")
                state = {"model": model.module.state_dict(), "losses": losses, "step": step}
                if not args.model_only:
                    state["opt"] = opt.state_dict()
                torch.save(state, tmp)
                tmp.replace(ckpt)
    hccl_sim.torch.report({"losses": losses,
                           "params": {k: v.detach().clone() for k, v in model.module.state_dict().items()}})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
