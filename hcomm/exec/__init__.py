"""Every byte mover of hccl-sim: executors of a DataProgram, which knows nothing of collectives.

- `data_program`: the DataProgram a plan is lowered to (loops, buffer layout, scratch shape,
  reduction) and the LoopBody of each loop program;
- `central`: a share of the serial data program over every rank's buffers (ranks that share memory);
- `shared_plane`: the central share for ranks that are processes, over shared memory (hcomm.memory);
- `per_rank`: one rank's own schedule over a Transport (ranks that share no memory; or some of
  them, on one host, its buffers in shared memory: `run_rank_in`); `schedules`: its steps in the
  form it runs, each with the fence that says which earlier sends must be consumed first;
- `own_result`: one rank's output from every rank's input (the small-op eager path);
- `planes`: the DataPlane a group holds (shared, hosted or per-rank), over the executors above;
- `p2p`: one rank's sends, receives and pending-receive matching over a Transport (send / recv,
  isend / irecv, BatchSendRecv), which the collective layer prices.
"""
from .central import run_share
from .data_program import DataLoop, DataProgram, LoopBody, with_scratch
from .own_result import OwnResult, own_result
from .per_rank import COLLECTIVE_TAG, run_rank, run_rank_in, run_schedule
from .planes import DataPlane, HostedPlane, PerRankPlane
from .shared_plane import SharedPlane

__all__ = ["DataLoop", "DataPlane", "DataProgram", "HostedPlane", "LoopBody", "OwnResult", "PerRankPlane", "SharedPlane",
           "COLLECTIVE_TAG", "own_result", "run_rank", "run_rank_in", "run_schedule", "run_share", "with_scratch"]
