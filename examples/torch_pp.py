"""Pipeline parallelism with `torch.distributed.pipelining` (a GPipe schedule) on emulated Ascend
NPUs: one decoder block per stage, a stage per rank.

    python examples/torch_pp.py --check                        # 8 Ray actors: 8 stages, one 910B server
    torchrun --nproc-per-node 8 examples/torch_pp.py           # 8 processes
    mpiexec -n 8 python examples/torch_pp.py                   # the same under MPI

The decoder (examples/tiny_lm.py, as many blocks as ranks) is cut into stages: the first also
embeds the tokens, the last also normalises and projects to the vocabulary and takes the loss.
ScheduleGPipe runs every step's batch as micro-batches: activations go forward stage to stage and
gradients back by torch's batch_isend_irecv, which runs on the backend's sends and receives
(priced as HcclSend / HcclRecv). Each step prints the loss, the transfers and collectives, their
simulated time and the wall time; `--check` compares with one process on the whole batch.
"""
import argparse
import sys

import torch
import torch.nn as nn

import tiny_lm

MICROBATCHES = 4


class Stage(nn.Module):
    """Block `k` of the model, with the embedding on the first stage and the head on the last."""

    def __init__(self, model, k, stages):
        super().__init__()
        self.first, self.last = k == 0, k == stages - 1
        self.block = model.blocks[k]
        if self.first:
            self.embed, self.pos = model.embed, model.pos
        if self.last:
            self.norm, self.head = model.norm, model.head

    def forward(self, x):
        if self.first:
            x = self.embed(x) + self.pos[: x.shape[1]]
        x = self.block(x)
        return self.head(self.norm(x)) if self.last else x


def _loss(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, tiny_lm.VOCAB), target.reshape(-1))


def train(steps, batch):
    """GPipe training, a stage per rank: per step (loss, ops, wall s, the simulated Step on the
    rank's device timeline), and the full final parameters (every stage's, gathered)."""
    import time
    import torch.distributed as dist
    import hccl_sim.torch
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tokens = tiny_lm.model_and_data(steps, batch, layers=world)
    names = {id(p): n for n, p in model.named_parameters()}
    stage = Stage(model, rank, world)
    schedule = ScheduleGPipe(PipelineStage(stage, rank, world, torch.device("cpu")), MICROBATCHES, loss_fn=_loss)
    opt = torch.optim.SGD(stage.parameters(), lr=tiny_lm.LR)
    rec = tiny_lm.Recorder({"pp": None})
    log = []
    with hccl_sim.torch.timeline() as timeline:
        for step in range(steps):
            rec.mark()
            timeline.mark()
            wall = time.perf_counter()
            opt.zero_grad()
            losses = []
            if stage.first:
                schedule.step(tokens[step, :, :-1])
            elif stage.last:
                schedule.step(target=tokens[step, :, 1:], losses=losses)
            else:
                schedule.step()
            opt.step()
            mean = torch.tensor([sum(float(loss) for loss in losses) / MICROBATCHES if losses else 0.0])
            dist.all_reduce(mean)                     # the last stage's, on every rank
            log.append((float(mean), rec.since(), time.perf_counter() - wall, timeline.since()))
    mine = {names[id(p)]: p.detach().clone() for p in stage.parameters()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    return log, {k: v for part in everyone for k, v in part.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=8, help="910B cards (stages) when not launched (default 8)")
    ap.add_argument("--check", action="store_true", help="compare with one process on the whole batch")
    tiny_lm.launch(train, f"GPipe, a stage per rank, {MICROBATCHES} micro-batches", ap.parse_args(),
                   sys.modules[__name__], layers=None)


if __name__ == "__main__":
    main()
