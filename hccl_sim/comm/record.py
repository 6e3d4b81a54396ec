"""What an operation did on a rank, in simulated time: `comm.last_op`, and, where a rank keeps one
(`comm.op_log`, which hccl_sim.testing sets), the log of every op it ran."""
from __future__ import annotations

from typing import NamedTuple


TRACE_FORMAT = "hccl-sim comm trace 1"
"""The format tag of a step's communication as hccl_sim.torch.export_trace writes it and
`hccl-sim replay` reads it."""

class OpRecord(NamedTuple):
    """What the last operation did on this rank, in simulated time (immutable)."""
    name: str
    algo: str
    nbytes: int
    count: int
    dtype: str
    start: int          # this rank's clock at entry, ns
    end: int            # this rank's clock at exit, ns
    retries: int = 0
    notes: tuple = ()   # what the fault machinery did in the op (e.g. a backup NIC switched to)

    @property
    def time(self) -> float:
        """This rank's simulated duration of the op, seconds."""
        return (self.end - self.start) / 1e9


class LoggedOp(NamedTuple):
    """One op in a rank's `comm.op_log`: the communicator it ran on (`scope`, "" for the world, and
    the job's rank of each of its ranks), its collective number there (`seq`, what a fault plan's
    `at_op` and a straggler's `ops` count; None for a point-to-point op) and its record."""
    scope: str
    world_ranks: tuple
    seq: int | None
    record: OpRecord


def note_p2p(comm, record: OpRecord) -> None:
    """`record` is `comm`'s last op, a point-to-point one (logged where the rank keeps a log)."""
    comm.last_op = record
    if comm.op_log is not None:
        comm.op_log.append(LoggedOp(comm.scope, comm.world_ranks, None, record))
