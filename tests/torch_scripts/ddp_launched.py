"""Launched by torchrun from tests/test_torch_backend.py: a plain script on the hccl_sim backend
(collectives, new_group, DDP; ranks of one host on the shared-memory plane); rank 0 prints one JSON line of what every rank saw."""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccl_sim.torch

steps = int(sys.argv[1])
dist.init_process_group(backend="hccl_sim")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.arange(4.0) * (rank + 1)
dist.all_reduce(t)
big = torch.full((1 << 16,), float(rank + 1))        # 256 KiB: past the eager size, on the data plane
dist.all_reduce(big)
plane = hccl_sim.torch._ours(dist.distributed_c10d._get_default_group()).comm.data_plane
sub = dist.new_group([0, world - 1])
s = torch.ones(1)
if rank in (0, world - 1):
    dist.all_reduce(s, group=sub)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
ddp = DDP(model, bucket_cap_mb=0.001)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(steps, 12, 8, generator=g), torch.randn(steps, 12, 4, generator=g)
n = 12 // world
for k in range(steps):
    mine = slice(rank * n, (rank + 1) * n)
    loss = ((ddp(x[k, mine]) - y[k, mine]) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
mine = {"rank": rank, "allreduce": t.tolist(), "sub": s.tolist(), "plane": plane,
        "big": sorted(set(big.tolist())),
        "params": [q.detach().flatten().tolist() for q in model.parameters()],
        "ops": len(hccl_sim.torch.records()), "sim": sum(r.time for r in hccl_sim.torch.records()),
        "by_place": hccl_sim.torch.world().transport.sent_by_place + (
            hccl_sim.torch.world().transport.host_steps.read_in_place if hccl_sim.torch.world().transport.host_steps
            else 0)}
everyone = [None] * world
dist.all_gather_object(everyone, mine)
if rank == 0:
    print("RESULT " + json.dumps(everyone), flush=True)
hccl_sim.torch.destroy_process_group()
