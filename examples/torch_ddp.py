"""An ordinary PyTorch DDP training script on emulated Ascend NPUs.

Each rank is a Ray actor of hccl-sim holding an emulated 910B; torch.distributed runs on the
"hccl_sim" backend, so every gradient AllReduce really moves the bytes between the ranks and is
priced on the modelled cluster. Apart from `hccl_sim.torch.init_process_group(comm)` and the
report of simulated time, `train` is the DDP loop of torch's tutorial.

    python examples/torch_ddp.py [--servers 1] [--steps 20]
"""
import argparse
import time

import hccl_sim


def train(comm, steps, batch):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import hccl_sim.torch

    hccl_sim.torch.init_process_group(comm)          # instead of dist.init_process_group("hccl")
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
    for step in range(steps):
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        before = len(hccl_sim.torch.records())
        wall = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs[step, mine]), labels[step, mine])
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss_sum := loss.detach().clone())
        ops = hccl_sim.torch.records()[before:]
        log.append((step, float(loss_sum) / world, len(ops), sum(op.time for op in ops), time.perf_counter() - wall))
    hccl_sim.torch.destroy_process_group()
    return log


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    topo = hccl_sim.topology("atlas800t-a2", servers=args.servers)
    logs = hccl_sim.run(train, topology=topo, engine="ray", args=(args.steps, args.batch))
    print(f"# torch DDP on {topo.num_ranks} emulated 910B ranks (Ray actors), backend hccl_sim")
    print(f"# {'step':>4} {'loss':>8} {'collectives':>11} {'simulated comm (us)':>20} {'wall (ms)':>10}")
    for step, loss, n, sim, wall in logs[0]:
        print(f"  {step:>4} {loss:>8.4f} {n:>11} {sim * 1e6:>20.2f} {max(log[step][4] for log in logs) * 1e3:>10.1f}")


if __name__ == "__main__":
    main()
