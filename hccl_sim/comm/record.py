"""What an operation did on a rank, in simulated time: `comm.last_op`."""
from __future__ import annotations

from typing import NamedTuple


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
