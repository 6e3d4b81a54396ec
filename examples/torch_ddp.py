"""An ordinary PyTorch DDP training script on emulated Ascend NPUs.

    torchrun --nproc-per-node 8 examples/torch_ddp.py          # 8 processes, one 910B server
    mpiexec -n 8 python examples/torch_ddp.py                  # the same under MPI (the MPI engine)
    HCCL_SIM_TOPOLOGY=atlas800t-a2:servers=2 torchrun --nproc-per-node 16 examples/torch_ddp.py
    python examples/torch_ddp.py                               # the same on hccl-sim's Ray engine

torch.distributed runs on the "hccl_sim" backend: every gradient AllReduce really moves the bytes
between the ranks and is priced on the modelled cluster (`hccl_sim.torch.records()`). Apart from
the backend's name, SyncBatchNorm's import and the report of simulated time (the rank's device
timeline: each step's compute, and the communication its gradient buckets did not hide behind
backward), `train` is the DDP loop of torch's tutorial.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccl_sim.torch


def train(steps, batch):
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 10))
    model = hccl_sim.torch.convert_sync_batchnorm(model)       # nn.SyncBatchNorm.convert_sync_batchnorm
    ddp_model = DDP(model)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1, momentum=0.9)

    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps, batch, 64, generator=generator)
    labels = torch.randint(0, 10, (steps, batch), generator=generator)
    per_rank = batch // world
    log = []
    with hccl_sim.torch.timeline() as timeline:      # kernels priced on the 910B, comm on its own stream
        for step in range(steps):
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            before = len(hccl_sim.torch.records())
            timeline.mark()
            wall = time.perf_counter()
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(inputs[step, mine]), labels[step, mine])
            loss.backward()
            optimizer.step()
            loss_sum = loss.detach().clone()
            dist.all_reduce(loss_sum)
            ops = hccl_sim.torch.records()[before:]
            log.append((step, float(loss_sum) / world, len(ops), sum(op.time for op in ops),
                        time.perf_counter() - wall, timeline.since()))
    return log


def report(logs, world, how):
    print(f"# torch DDP on {world} emulated 910B ranks ({how}), backend hccl_sim; simulated on rank 0: the step, "
          "its compute (kernels on the 910B roofline, peak FLOPs a third-party figure) and exposed communication")
    print(f"# {'step':>4} {'loss':>8} {'collectives':>11} {'comm (us)':>10} {'step (us)':>10} {'compute (us)':>12} "
          f"{'exposed (us)':>12} {'wall (ms)':>10}")
    for step, loss, n, sim, _, t in logs[0]:
        print(f"  {step:>4} {loss:>8.4f} {n:>11} {sim * 1e6:>10.2f} {t.time / 1e3:>10.2f} {t.compute / 1e3:>12.2f} "
              f"{t.exposed / 1e3:>12.2f} {max(log[step][4] for log in logs) * 1e3:>10.1f}")


def on_ray_rank(comm, steps, batch):
    hccl_sim.torch.init_process_group(comm)
    try:
        return train(steps, batch)
    finally:
        hccl_sim.torch.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--servers", type=int, default=1, help="910B servers when not under torchrun (default 1)")
    args = ap.parse_args()
    # MPI's first: importing hccl_sim.torch under mpirun sets RANK as torchrun would
    launcher = "mpirun" if hccl_sim.torch.mpi_launch.launched() else "torchrun" if "RANK" in os.environ else None
    if launcher:                                   # one process per rank, rank and world size the launcher's
        dist.init_process_group(backend="hccl_sim")
        log = train(args.steps, args.batch)
        logs = [None] * dist.get_world_size()
        dist.all_gather_object(logs, log)
        if dist.get_rank() == 0:
            report(logs, dist.get_world_size(), f"{launcher} processes")
        hccl_sim.torch.destroy_process_group()
    else:
        topo = hccl_sim.topology("atlas800t-a2", servers=args.servers)
        logs = hccl_sim.run(on_ray_rank, topology=topo, engine="ray", args=(args.steps, args.batch))
        report(logs, topo.num_ranks, "Ray actors")


if __name__ == "__main__":
    main()
