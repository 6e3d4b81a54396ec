"""Pipeline parallelism as a torch_npu script: `torch.distributed.pipelining`'s GPipe, a decoder
block per NPU, run unchanged on emulated NPUs (its activations and gradients go by
batch_isend_irecv, one HcclBatchSendRecv per batch as on torch_npu):

    hccl-sim torchrun --nproc-per-node 4 examples/ascend/pp_train.py

The decoder, data and one-process reference are examples/tiny_lm.py's, as many blocks as ranks;
the stages are examples/torch_pp.py's.
"""
import os
import time

import torch
import torch_npu  # noqa: F401
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import npu_common
import tiny_lm
import torch_pp as pp


def main():
    args = npu_common.options(__doc__, 16)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    device = torch.device("npu", local_rank)
    dist.init_process_group(backend="hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tokens = tiny_lm.model_and_data(args.steps, args.batch, layers=world)
    stage = pp.Stage(model, rank, world).to(device)
    schedule = ScheduleGPipe(PipelineStage(stage, rank, world, device), pp.MICROBATCHES, loss_fn=pp._loss)
    opt = torch.optim.SGD(stage.parameters(), lr=tiny_lm.LR)
    losses, walls = [], []
    for step in range(args.steps):
        wall = time.perf_counter()
        opt.zero_grad()
        out = []
        if stage.first:
            schedule.step(tokens[step, :, :-1].to(device))
        elif stage.last:
            schedule.step(target=tokens[step, :, 1:].to(device), losses=out)
        else:
            schedule.step()
        opt.step()
        mean = torch.tensor([sum(float(v) for v in out) / pp.MICROBATCHES if out else 0.0], device=device)
        dist.all_reduce(mean)                 # the last stage's loss, on every rank
        losses.append(mean.item())
        walls.append(time.perf_counter() - wall)
    if rank == 0:
        npu_common.finish(args, world, losses, walls, tiny_lm.reference(args.steps, args.batch, layers=world)[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
