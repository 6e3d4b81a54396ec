"""The engine contract: what a Communicator needs from the engine that placed its rank.

It lives beside the Communicator, which states what it needs; the engines (hccl_sim.engines) sit
above and implement it. An engine places ranks (threads, Ray actors, MPI processes) and hands each
rank's Communicator a `RankGroup`. Every collective call then goes through the group in two separate phases:

1. `rendezvous(rank, call) -> OpPlan`. Carries no data: every rank's `Call` (signature, entry
   clock, item size) goes in, the shared plan comes out. The one exception is MPI's eager
   protocol: an op whose input is at most the group's `eager_bytes` (0: never) carries it with
   the call, and execution then needs no further exchange (hccl_sim.plan.planner.make_plan, so every
   engine gets the same plan and the same simulated times). Mismatched calls, a rank that failed
   or returned early, and a missed deadline are raised on every waiting rank as HcclErrors
   (engines.rendezvous holds this bookkeeping for every engine).
2. `execute(rank, seq, data, buffers)`. Moves the bytes of `data`, the plan lowered to a
   hcomm.exec DataProgram (it knows nothing of the plan or the collective), by one of two executors:
   - the central data program (`hcomm.exec.run_share`): for ranks that share memory, each
     participant runs a share of the op's serial data program over every rank's registered
     buffers in place, then all meet once more (no rank returns before its output is complete);
   - the per-rank executor (`hcomm.exec.run_rank`) over an hcomm Transport (post / take /
     consumed / wait-consumed / deadline / abort): each rank runs its own schedule, sending its
     own slices to the peers the schedule names. Used whenever ranks share no memory.

Point-to-point send/recv move their bytes over `group.transport` (hcomm.exec.p2p) and are
priced by the cost model; a
group under a fault plan also has `fault_progress` (hccl_sim.faults.progress), which its plans advance
and which tells a receiver which of its transfers a `corrupt` entry hits.
Results come from `result_array` (an engine may keep them where peers can write them).
`fail(rank, exc)` and `exit(rank)` tell the group that a rank raised or returned, so waits on it
end at once. Every wait has a deadline (HCCL_EXEC_TIMEOUT).

Sub-communicators (`comm.split`, `comm.shrink`): `subgroup(rank, members, scope, topo, config)`,
called by every member, returns this rank's RankGroup of the members (ranks of this group, in the
new communicator's order; `topo` is their topologies.subset, `scope` a name every member derives
alike). Engines whose ranks share memory give all members one new group; the others give each
member a view of the job's transport (hcomm.transports.scoped). `abort(rank, reason)`
(`comm.abort()`) fails every pending and later wait of this group, on every rank, and nothing of
its parent's or its siblings'.

A fault plan's rank_crash is decided from the plan by every rank alike (faults.BoundFaults).
Every rank of the op then calls one of two hooks:
1. the dead rank calls `die(rank, seq, data, buffers, steps)`, then raises RankCrashed.
   Where ranks are processes, `die` moves the data of the rank's first `steps` steps and ends the
   rank: Ray ends its process (it does not return); MPI, whose process must live on, stops the
   rank taking part and returns.
2. every other rank calls `execute_lost(rank, seq, data, buffers, dead)`, then raises the
   planned error. Where ranks are processes, it runs the rank's part of the op until its data
   plane finds `dead` gone.
Ranks that are threads of one process move no data in either: the base class's hooks do nothing.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np


class Call(NamedTuple):
    """One rank's side of a collective call, as the rendezvous compares it."""
    seq: int                  # the call's number on this communicator (0, 1, ...)
    signature: object         # planner.Signature: what every rank must agree on
    clock: int                # the rank's entry clock, ns
    itemsize: int             # bytes per element (1 for a barrier)
    eager: Optional[np.ndarray] = None   # the input itself, when at most RankGroup.eager_bytes
    sent: tuple = ()          # the rank's sends so far on the pairs its fault plan counts (fault_state)


class RankBuffers(NamedTuple):
    """One rank's registered memory for a collective: the user's input and output, and the
    communicator-buffer scratch area the schedule may use (None when it uses none)."""
    input: Optional[np.ndarray]
    output: Optional[np.ndarray]
    scratch: Optional[np.ndarray]


class RankGroup:
    """The base of every engine's group: the contract (see the module docstring), with every
    optional hook declared here with its default, so that a Communicator never probes a group.

    Required of every engine: `rendezvous`, `execute`, `fail`, `exit`, `subgroup`, `abort` (the
    defaults raise E_NOT_SUPPORT naming the engine). Optional, with the default behaviour of ranks
    that are threads of one process: `eager_op` (the two phases), `result_array` (a plain array),
    `writes_in_place` (never),
    `die` and `execute_lost` (a crashed rank moves no data: nothing to do), `close` (nothing held).
    """
    engine: str = "?"               # the engine's name, for errors
    size: int
    topo: object                    # topologies.Topology
    config: object                  # env.Config
    transport: object               # an hcomm Transport, for point to point
    eager_bytes: int = 0            # inputs up to this size travel with the call (0: never)
    ranks_per_process: int = 1      # ranks of the job that are threads of this process (torch.distributed,
                                    # one default group per process, needs 1)
    data_plane: str = "?"           # the plane execute() moves bytes on, by the engine's name for it
                                    # (comm.data_plane; README, "Engines", lists every engine's)
    plain_result_bytes: int = 0     # results of fewer bytes are plain np.empty arrays, which the
                                    # Communicator then makes itself (a loop of small ops skips the call)
    fault_progress = None           # fault_state.FaultProgress under a fault plan that counts transfers

    def _not_offered(self, hook: str):
        from topologies.errors import HcclError
        return HcclError("E_NOT_SUPPORT", f"engine {self.engine} does not offer {hook}")

    def rendezvous(self, rank: int, call: Call):
        """Meet every rank for collective #call.seq; return the shared OpPlan."""
        raise self._not_offered("rendezvous")

    def execute(self, rank: int, seq: int, data, buffers: RankBuffers) -> None:
        """Move this rank's part of the op's data (`data`, a hcomm.exec DataProgram); returns when
        this rank's output is complete."""
        raise self._not_offered("execute")

    def eager_op(self, rank: int, call: Call, out: np.ndarray):
        """Both phases of a call whose input travels with it (call.eager; no fault plan), its
        result written into `out`: (the op's plan, this rank's exit clock). Default: the two
        phases; a group whose ranks compute their own result (engines.peer_group) runs a repeated
        call on a lean path (engines/eager_lane.py)."""
        plan = self.rendezvous(rank, call)
        self.execute(rank, call.seq, plan.data, RankBuffers(call.eager, out, None))
        return plan, plan.exit_of(rank)

    def result_array(self, shape: tuple, dtype) -> np.ndarray:
        """An array for a collective's result (an engine may keep it where peers can write it)."""
        return np.empty(shape, dtype=dtype)

    def writes_in_place(self, out: np.ndarray) -> bool:
        """Whether an op may write its result straight into the user's `out=` (peers write it
        where it lies); otherwise the result is made apart and copied into `out`."""
        return False

    def fail(self, rank: int, exc: BaseException) -> None:
        """`rank` raised: release every waiting rank with an error naming it."""
        raise self._not_offered("fail")

    def exit(self, rank: int) -> None:
        """`rank` returned: waits on it fail at once instead of at their deadline."""
        raise self._not_offered("exit")

    def subgroup(self, rank: int, members: tuple, scope: str, topo, config) -> "RankGroup":
        """This rank's group of a sub-communicator of `members` (see the module docstring)."""
        raise self._not_offered("sub-communicators")

    def abort(self, rank: int, reason: str) -> None:
        """`rank` aborted the communicator: every pending and later op of this group fails."""
        raise self._not_offered("abort")

    def die(self, rank: int, seq: int, data, buffers: RankBuffers, steps: int) -> None:
        """A fault plan crashes `rank` in this op after its first `steps` steps. Ranks that are
        threads move no data: the rank then raises RankCrashed. Engines whose ranks are processes
        move the data of those steps and end the rank (see the module docstring)."""

    def execute_lost(self, rank: int, seq: int, data, buffers: RankBuffers, dead: int) -> None:
        """This rank's part of an op in which `dead` dies. Ranks that are threads move no data:
        the planned error is raised. Engines whose ranks are processes run the part until their
        data plane finds `dead` gone."""

    def close(self) -> None:
        """Release what the group holds (shared segments, worker pools); idempotent."""
