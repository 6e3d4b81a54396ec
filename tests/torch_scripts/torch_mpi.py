"""Launched by `mpiexec -n N` from tests/test_torch_backend.py (no torchrun variables):
(a) a plain script: dist.init_process_group(backend="hccl_sim") takes rank and world size from MPI,
    its collectives run on the MPI engine and cost what the local engine says; new_group; DDP's
    parameters equal one process on the whole batch;
(b) inside hccl_sim.run(fn, engine="mpi"): hccl_sim.torch.init_process_group(comm);
(c) ranks_per_process=2 (two ranks as threads of a process) is refused, on every rank.
Each process prints "OK <rank>" when every check held."""
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hccl_sim
import hccl_sim.torch as ht
import topologies
from hccl_sim.engines.mpi import MpiGroup

assert "TORCHELASTIC_RUN_ID" not in os.environ, "meant for mpiexec, not torchrun"
# importing hccl_sim.torch under mpiexec set torch's env:// variables, as torchrun would have
assert os.environ["RANK"] == str(hccl_sim.engines.mpi.world().Get_rank()) and "MASTER_PORT" in os.environ
STEPS = 3


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, 12, 8, generator=g), torch.randn(STEPS, 12, 4, generator=g)


def train(net, rank, world):
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = data()
    n = 12 // world
    for s in range(STEPS):
        mine = slice(rank * n, (rank + 1) * n)
        loss = ((net(x[s, mine]) - y[s, mine]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


# (a) a plain script -------------------------------------------------------------------------------------
dist.init_process_group(backend="hccl_sim")
rank, world = dist.get_rank(), dist.get_world_size()
mpi = hccl_sim.engines.mpi.world()
assert (rank, world) == (mpi.Get_rank(), mpi.Get_size()), (rank, world)
pg = ht._ours(dist.distributed_c10d._get_default_group())
assert isinstance(pg.comm._group, MpiGroup), type(pg.comm._group)
# one node: the shared windows, unless HCCL_SIM_DATA_PLANE names the plane
assert pg.comm.data_plane == os.environ.get("HCCL_SIM_DATA_PLANE", "window"), pg.comm.data_plane
t = torch.arange(4.0) * (rank + 1)
dist.all_reduce(t)
assert t.tolist() == [k * world * (world + 1) / 2 for k in range(4)], t
topo = topologies.presets.filled("atlas800t-a2", world)


def twin(comm):
    comm.all_reduce(np.zeros(4, np.float32))
    return comm.last_op.time


assert ht.records()[0].time == hccl_sim.run(twin, topology=topo)[rank]
sub = dist.new_group([0, world - 1])
s = torch.ones(1)
if rank in (0, world - 1):
    dist.all_reduce(s, group=sub)
assert s.item() == (2.0 if rank in (0, world - 1) else 1.0)
net = model()
train(DDP(net, bucket_cap_mb=0.001), rank, world)
ref = model()
train(ref, 0, 1)
for a, b in zip(net.parameters(), ref.parameters()):
    assert torch.allclose(a, b, atol=1e-5), (a, b)
ht.destroy_process_group()


# (b) inside hccl_sim.run(engine="mpi") ---------------------------------------------------------------------
def in_run(comm):
    ht.init_process_group(comm)
    x = torch.full((3,), float(comm.rank + 1))
    dist.all_reduce(x)
    ops = len(ht.records())
    ht.destroy_process_group()
    return x.tolist(), ops


got = hccl_sim.run(in_run, topology=topo, engine="mpi")
assert got == [([world * (world + 1) / 2] * 3, 1)] * world, got


# (c) ranks as threads of a process: refused ----------------------------------------------------------------
try:
    hccl_sim.run(in_run, topology=topologies.presets.filled("atlas800t-a2", 2 * world), engine="mpi",
                 ranks_per_process=2)
except hccl_sim.HcclError as exc:
    assert exc.code == "E_NOT_SUPPORT" and "one default process group per process" in str(exc), exc
else:
    raise AssertionError("two ranks per process were accepted")
print(f"OK {rank}", flush=True)
