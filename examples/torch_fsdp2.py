"""FSDP2 (`torch.distributed.fsdp.fully_shard`) of a small decoder-only transformer on emulated
Ascend NPUs.

    python examples/torch_fsdp2.py --check                     # 8 Ray actors, one 910B server
    torchrun --nproc-per-node 8 examples/torch_fsdp2.py        # 8 processes
    mpiexec -n 8 python examples/torch_fsdp2.py                # the same under MPI (the MPI engine)

Every block and the whole model (examples/tiny_lm.py) are sharded over a 1-D DeviceMesh of the
ranks on the "hccl_sim" backend: FSDP2's parameter AllGathers and gradient ReduceScatters really
move the shards between the ranks and are priced on the modelled cluster. Each step prints the
loss (the mean over the ranks' shares of the batch), the collectives and the HCCL algorithm each
ran, their simulated time and the wall time; `--check` also trains the same model in this one
process on the whole batch and compares the losses and the final parameters.
"""
import argparse
import sys

import tiny_lm


def train(steps, batch):
    """FSDP2 training on this rank's share of each step's batch: per step (loss, ops, wall s),
    and the full final parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tokens = tiny_lm.model_and_data(steps, batch)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    share = batch // world
    rec = tiny_lm.Recorder({"dp": mesh.get_group("dp"), "world": None})
    log = tiny_lm.train_steps(model, tokens, slice(rank * share, (rank + 1) * share), rec)
    return log, tiny_lm.full_parameters(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=8, help="910B cards when not launched (default 8, one server)")
    ap.add_argument("--check", action="store_true", help="compare with one process on the whole batch")
    tiny_lm.launch(train, f"FSDP2 of a {tiny_lm.LAYERS}-layer decoder", ap.parse_args(), sys.modules[__name__])


if __name__ == "__main__":
    main()
