"""The engine contract: what a Communicator needs from the engine that placed its rank.

An engine places ranks (threads, Ray actors, MPI processes) and hands each rank's Communicator a
`Group`. Every collective call then goes through the group in two separate phases:

1. `rendezvous(rank, call) -> OpPlan`. Carries no data: every rank's `Call` (signature, entry
   clock, item size) goes in, the shared plan comes out. The one exception is MPI's eager
   protocol: an op whose input is at most the group's `eager_bytes` (0: never) carries it with
   the call, and execution then needs no further exchange (hccl_sim.planner.make_plan, so every
   engine gets the same plan and the same simulated times). Mismatched calls, a rank that failed
   or returned early, and a missed deadline are raised on every waiting rank as HcclErrors
   (engines.rendezvous holds this bookkeeping for every engine).
2. `execute(rank, seq, plan, buffers, redop)`. Moves the bytes, by one of two executors:
   - the central data program (`dataplane.move_share`): for ranks that share memory, each
     participant runs a share of the op's serial data program over every rank's registered
     buffers in place, then all meet once more (no rank returns before its output is complete);
   - the per-rank executor (`hcomm.executor.execute`) over an hcomm Transport (post / take /
     consumed / wait-consumed / deadline / abort): each rank runs its own schedule, sending its
     own slices to the peers the schedule names. Used whenever ranks share no memory.

Point-to-point send/recv use `group.transport` directly and are priced by the cost model; a
group under a fault plan also has `fault_progress` (hccl_sim.fault_state), which its plans advance
and which tells a receiver which of its transfers a `corrupt` entry hits.
Results come from `result_array` (an engine may keep them where peers can write them).
`fail(rank, exc)` and `exit(rank)` tell the group that a rank raised or returned, so waits on it
end at once. Every wait has a deadline (HCCL_EXEC_TIMEOUT).

Sub-communicators (`comm.split`, `comm.shrink`): `subgroup(rank, members, scope, topo, config)`,
called by every member, returns this rank's Group of the members (ranks of this group, in the
new communicator's order; `topo` is their topologies.subset, `scope` a name every member derives
alike). Engines whose ranks share memory give all members one new group; the others give each
member a view of the job's transport (hcomm.transports.scoped). `abort(rank, reason)`
(`comm.abort()`) fails every pending and later wait of this group, on every rank, and nothing of
its parent's or its siblings'.

A fault plan's rank_crash is decided from the plan by every rank alike (faults.BoundFaults). An
engine whose ranks are processes makes it real with two optional methods: `die(rank, seq, plan,
buffers, redop, steps)` runs the dead rank's first `steps` steps of the op and ends its process
(Ray: it does not return) or, where a process must live on (MPI), stops the rank taking part and
returns (the rank then raises RankCrashed); `execute_lost(rank, seq, plan, buffers, redop, dead)` runs a surviving rank's
part of the op until its data plane finds `dead` gone (it raises that HcclError) or the part is
done. Without them (ranks in one process) the dead rank raises RankCrashed and nobody moves data.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Protocol

import numpy as np


class Call(NamedTuple):
    """One rank's side of a collective call, as the rendezvous compares it."""
    seq: int                  # the call's number on this communicator (0, 1, ...)
    signature: object         # planner.Signature: what every rank must agree on
    clock: int                # the rank's entry clock, ns
    itemsize: int             # bytes per element (1 for a barrier)
    eager: Optional[np.ndarray] = None   # the input itself, when at most Group.eager_bytes
    sent: tuple = ()          # the rank's sends so far on the pairs its fault plan counts (fault_state)


class RankBuffers(NamedTuple):
    """One rank's registered memory for a collective: the user's input and output, and the
    communicator-buffer scratch area the schedule may use (None when it uses none)."""
    input: Optional[np.ndarray]
    output: Optional[np.ndarray]
    scratch: Optional[np.ndarray]


class Group(Protocol):
    """What every engine gives a Communicator (see the module docstring for the semantics)."""
    size: int
    topo: object              # topologies.Topology
    config: object            # env.Config
    transport: object         # an hcomm Transport, for point to point
    eager_bytes: int          # inputs up to this size travel with the call (0: never)
    ranks_per_process: int    # ranks of the job that are threads of this process (torch.distributed,
                              # one default group per process, needs 1)
    data_plane: str           # the plane execute() moves bytes on, by the engine's name for it
                              # (comm.data_plane; README, "Engines", lists every engine's)

    def rendezvous(self, rank: int, call: Call):
        """Meet every rank for collective #call.seq; return the shared OpPlan."""

    def execute(self, rank: int, seq: int, plan, buffers: RankBuffers, redop) -> None:
        """Move this rank's part of the op's data; returns when this rank's output is complete."""

    def result_array(self, shape: tuple, dtype) -> np.ndarray:
        """An array for a collective's result. A group may say `plain_result_bytes = n`: results
        of fewer than n bytes are plain np.empty arrays, which the Communicator then makes itself
        (a loop of small ops skips the call)."""

    def fail(self, rank: int, exc: BaseException) -> None:
        """`rank` raised: release every waiting rank with an error naming it."""

    def exit(self, rank: int) -> None:
        """`rank` returned: waits on it fail at once instead of at their deadline."""

    def subgroup(self, rank: int, members: tuple, scope: str, topo, config) -> "Group":
        """This rank's group of a sub-communicator of `members` (see the module docstring)."""

    def abort(self, rank: int, reason: str) -> None:
        """`rank` aborted the communicator: every pending and later op of this group fails."""
