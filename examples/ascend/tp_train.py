"""Tensor parallelism as a torch_npu script: `parallelize_module` (Megatron's column / row split)
over an "npu" DeviceMesh of every rank, run unchanged on emulated NPUs:

    hccl-sim torchrun --nproc-per-node 4 examples/ascend/tp_train.py

The decoder, data and one-process reference are examples/tiny_lm.py's (HEADS must divide by the
ranks).
"""
import os
import time

import torch
import torch_npu  # noqa: F401
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import npu_common
import tiny_lm


def main():
    args = npu_common.options(__doc__, 16)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl")
    world = dist.get_world_size()
    mesh = init_device_mesh("npu", (world,), mesh_dim_names=("tp",))
    model, tokens = tiny_lm.model_and_data(args.steps, args.batch)
    model = model.npu()
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
    # foreach=False: torch groups DTensor and plain parameters of one device into one foreach call on an
    # accelerator (and refuses the mix); on the CPU it never takes that path
    opt = torch.optim.SGD(model.parameters(), lr=tiny_lm.LR, foreach=False)
    losses, walls = [], []
    for step in range(args.steps):
        wall = time.perf_counter()
        loss = tiny_lm.lm_loss(model, tokens[step].npu())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        walls.append(time.perf_counter() - wall)
    if dist.get_rank() == 0:
        npu_common.finish(args, world, losses, walls, tiny_lm.reference(args.steps, args.batch)[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
