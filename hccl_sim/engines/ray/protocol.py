"""Typed messages of the Ray engine: what crosses between the driver, the rank actors and the
control plane. Nothing positional: every message is a small frozen dataclass.

- RankInfo      an actor's answer at start-up: where it runs (Ray node id, pid).
- RunSpec       the driver's instructions for one run: the session, the data plane, the peers'
                transport addresses, the run's Config (HCCL settings and faults).
- Outcome       an actor's answer for one run: its result, or its error (code, reason, its fields,
                when), and the rank a fault plan crashed under it; or, made by the driver, its
                actor's death.
- RankStatus    what a rank is waiting for, for the driver's stall watch.
- CallPayload   a rank's side of a collective's rendezvous (signature, entry clock, item size,
                an eager op's input), the bytes the control plane's allgather carries.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from topologies.errors import Cause, HcclError

from ..peer_group import CallPayload  # noqa: F401 - the control plane's payload, engine-neutral


@dataclass(frozen=True)
class RankInfo:
    rank: int
    pid: int
    node_id: str
    node_ip: str
    rss_mb: float


@dataclass(frozen=True)
class RunSpec:
    session: str
    data_plane: str                     # "shm" | "socket" | "object"
    peers: dict = field(default_factory=dict)   # rank -> (host, port) of its socket transport
    config: Any = None                  # this run's hccl_sim.config.env.Config (None: the actor's own)
    nodes: tuple = ()                   # each rank's Ray node id (ranks of one node share memory)
    bind: bool = True                   # bind a rank's thread to a CPU where a node's ranks outnumber them (engines/binding.py)


@dataclass(frozen=True)
class Outcome:
    rank: int
    ok: bool
    value: Any = None
    code: Optional[str] = None          # HcclResult name for an HcclError, None for another exception
    reason: str = ""
    op: Optional[str] = None
    error_type: str = ""
    traceback: str = ""
    at: float = 0.0                     # time.time() when the error was caught (rendezvous.root_cause)
    lost: tuple = ()                    # the job's ranks the fault plan crashed in this rank's ops
    died: bool = False                  # the rank's actor process died (its outcome is the driver's)
    fields: dict = field(default_factory=dict)  # an HcclError's fields (HcclError.fields(): cause, peers, ...)

    @classmethod
    def failed(cls, rank: int, exc: HcclError, at: float, **kw) -> "Outcome":
        """The outcome of a rank whose run raised HcclError `exc`, every field of it carried."""
        return cls(rank, False, code=exc.code, reason=exc.reason, op=exc.op, at=at, fields=exc.fields(), **kw)

    def error(self) -> HcclError:
        if self.code:
            return HcclError(self.code, self.reason, rank=self.rank, op=self.op, **self.fields)
        return HcclError("E_INTERNAL", f"{self.error_type}: {self.reason}\n{self.traceback}".rstrip(), rank=self.rank)


def died_outcome(rank: int, reason: str, at: float) -> Outcome:
    """The driver's outcome of a rank whose actor process died: that rank's own failure (RANK_DIED),
    never a consequence of another's."""
    return Outcome(rank, False, code="E_REMOTE", reason=reason, at=at, died=True, fields={"cause": Cause.RANK_DIED})


@dataclass(frozen=True)
class RankStatus:
    rank: int
    waiting: Optional[str]              # what it waits for, None when running
    progress: int                       # waits completed so far (changes whenever it moves)
