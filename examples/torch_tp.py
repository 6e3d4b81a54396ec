"""Tensor parallelism (`parallelize_module`, Megatron's column / row split) on a 2-D DeviceMesh,
with FSDP2 over the other dimension: the LLaMA layout (TP inside a server, DP across) at toy size,
on emulated Ascend NPUs.

    python examples/torch_tp.py --check                        # 8 Ray actors: dp 2 x tp 4
    python examples/torch_tp.py --tp 8 --check                 # tp 8, the seed's TP8 (dp 1)
    torchrun --nproc-per-node 8 examples/torch_tp.py --tp 4    # 8 processes
    mpiexec -n 8 python examples/torch_tp.py --tp 4            # the same under MPI

Each block of the decoder (examples/tiny_lm.py) splits q, k, v and the MLP's up projection by
columns and the attention's output and the MLP's down projection by rows over the mesh's "tp"
dimension (each rank holds HEADS / tp heads); the blocks and the model are then sharded by FSDP2
over "dp". The ranks of one tp group see the same share of the batch. Each step prints the loss,
the collectives per mesh dimension with the HCCL algorithm each ran, the simulated communication
time of each dimension, and the wall time; `--check` compares with one process on the whole batch;
`--trace FILE` writes rank 0's last step for `hccl-sim replay FILE --servers 512 --mesh dp=512,tp=8`.
"""
import argparse
import sys

import tiny_lm

TP = 4
TRACE = None                  # --trace: where rank 0 writes its last step's communication


def train(steps, batch):
    """TP x FSDP2 training: per step (loss, ops, wall s), and the full final parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    world = dist.get_world_size()
    if world % TP or tiny_lm.HEADS % TP:
        raise SystemExit(f"--tp {TP} must divide the {world} ranks and the {tiny_lm.HEADS} heads")
    mesh = init_device_mesh("cpu", (world // TP, TP), mesh_dim_names=("dp", "tp"))
    model, tokens = tiny_lm.model_and_data(steps, batch)
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)
        if mesh["dp"].size() > 1:
            fully_shard(block, mesh=mesh["dp"])
    if mesh["dp"].size() > 1:
        fully_shard(model, mesh=mesh["dp"])
    dp_rank, share = mesh["dp"].get_local_rank(), batch // mesh["dp"].size()
    rec = tiny_lm.Recorder({"tp": mesh.get_group("tp"), "dp": mesh.get_group("dp"), "world": None})
    log = tiny_lm.train_steps(model, tokens, slice(dp_rank * share, (dp_rank + 1) * share), rec, TRACE)
    return log, tiny_lm.full_parameters(model)


def main():
    global TP, TRACE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tp", type=int, default=TP, help=f"tensor-parallel size (default {TP})")
    ap.add_argument("--ranks", type=int, default=8, help="910B cards when not launched (default 8, one server)")
    ap.add_argument("--check", action="store_true", help="compare with one process on the whole batch")
    ap.add_argument("--trace", help="write rank 0's last step's communication here, for hccl-sim replay")
    args = ap.parse_args()
    TP, TRACE = args.tp, args.trace and __import__("os").path.abspath(args.trace)
    tiny_lm.launch(train, f"TP {TP} x FSDP2 of a {tiny_lm.LAYERS}-layer decoder", args, sys.modules[__name__])


if __name__ == "__main__":
    main()
