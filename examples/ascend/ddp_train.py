"""A torch_npu data-parallel training script written the way Ascend's PyTorch guide writes one, run
unchanged on emulated NPUs:

    hccl-sim torchrun --nproc-per-node 8 examples/ascend/ddp_train.py --steps 5
    torchrun --nproc-per-node 8 -m hccl_sim.torch.npu_main examples/ascend/ddp_train.py   # the same
    mpirun -n 4 python -m hccl_sim.torch.npu_main examples/ascend/ddp_train.py

Rank 0 prints each step's loss, and at the end the losses of one process training on the whole
batch (the same model, data and seed) beside them: data parallelism over HCCL gives the same
numbers. `--json FILE` writes both, with wall time per step.
"""
import argparse
import json
import os
import time

import torch
import torch_npu  # noqa: F401 - torch.npu and backend "hccl"
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))


def batch(step, size):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(-4, 5, (size, 32), generator=g).float()
    return x, torch.randint(0, 8, (size,), generator=g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = DDP(model().npu(), device_ids=[local_rank])
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    losses, walls = [], []
    share = args.batch // world
    for step in range(args.steps):
        start = time.perf_counter()
        x, y = batch(step, args.batch)
        x, y = x[rank * share:(rank + 1) * share].npu(), y[rank * share:(rank + 1) * share].npu()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
        walls.append(time.perf_counter() - start)
    if rank == 0:
        single, sopt = model(), None
        sopt = torch.optim.SGD(single.parameters(), lr=0.05)
        alone = []
        for step in range(args.steps):
            x, y = batch(step, share * world)
            loss = torch.nn.functional.cross_entropy(single(x), y)
            sopt.zero_grad()
            loss.backward()
            sopt.step()
            alone.append(loss.item())
        for step, (a, b) in enumerate(zip(losses, alone)):
            print(f"step {step}: loss {a:.6f} on {world} npus, {b:.6f} in one process")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": world, "losses": losses, "one_process": alone, "wall_s": walls}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
