"""FSDP2 (`fully_shard`) as a torch_npu script, run unchanged on emulated NPUs:

    hccl-sim torchrun --nproc-per-node 8 examples/ascend/fsdp2_train.py

Every block and the whole decoder (examples/tiny_lm.py) are sharded over an "npu" DeviceMesh of
the ranks; rank 0 prints the mean loss beside one process's on the whole batch, and the peak of
simulated HBM its parameters and activations took (`torch.npu.max_memory_allocated`).
"""
import os
import time

import torch
import torch_npu  # noqa: F401
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import npu_common
import tiny_lm


def main():
    args = npu_common.options(__doc__, 32)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("npu", (world,), mesh_dim_names=("dp",))
    model, tokens = tiny_lm.model_and_data(args.steps, args.batch)
    model = model.npu()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=tiny_lm.LR)
    share = args.batch // world
    losses, walls = [], []
    for step in range(args.steps):
        wall = time.perf_counter()
        loss = tiny_lm.lm_loss(model, tokens[step, rank * share:(rank + 1) * share].npu())
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
        walls.append(time.perf_counter() - wall)
    if rank == 0:
        npu_common.finish(args, world, losses, walls, tiny_lm.reference(args.steps, args.batch)[0])
        print(f"peak simulated HBM of rank 0's tensors: {torch.npu.max_memory_allocated() / 2**20:.2f} MiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
