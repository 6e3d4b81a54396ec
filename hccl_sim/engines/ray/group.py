"""One rank's RankGroup (the engine contract, comm/rank_group.py) inside its Ray actor.

The engine-neutral part (rendezvous over the control plane's allgather, planning on every rank,
eager small ops, the data planes, the crash hook, sub-communicators) is engines/peer_group.py's
PeerGroup. What is Ray's own:
- the control plane: shared memory on one host (ShmControl); across hosts each node's ranks meet in
  shared memory and one leader per node crosses (NodeControl), or the peer transport's allgather;
- the data plane "shm" (every rank on one host): the shared plane (hcomm.exec.shared_plane) over
  the actor's segments (hcomm.memory.segment_provider); "socket" / "object" (ranks that share no
  memory) run the per-rank executor over direct TCP or Ray's object store;
- the stall watch (every wait recorded for the driver's deadlock verdict) and a fault plan's
  rank_crash (the dead rank's process exits; its peers find it gone).
Point-to-point send/recv use the peer transport on every plane.
"""
from __future__ import annotations

import os
import time

from hcomm.transports.watched import WatchedTransport

from ..peer_group import PeerGroup

CRASH_EXIT_STATUS = 70             # the exit status of a crashed rank's process should Ray not end it (EX_SOFTWARE)
_KILL_WAIT_S = 5.0                 # how long it waits for Ray to end it: a kill takes milliseconds


class RayGroup(PeerGroup):
    engine = "ray"

    def __init__(self, rank, topo, config, plane, control, transport, watch, memory=None, lost_world=None):
        super().__init__(rank, topo, config, control, WatchedTransport(transport, watch), raw_transport=transport,
                         watch=watch)
        self.watch = watch
        if plane is not None and plane.shared_data:       # (a RayPlane; None: a sub-communicator's)
            self._use_shared_plane(memory)
        # the job's ranks a fault plan crashed in an op of this rank's communicators (shared with
        # its sub-communicators' groups): the driver takes those deaths for the plan's
        self.lost_world = set() if lost_world is None else lost_world

    def _end_rank(self, rank) -> None:
        """The rank's process ends as a crashed one does: no goodbye to its peers, no clean-up,
        nothing flushed. Its peers find it by its closed connections (socket), its actor's death
        (object) or its process gone from the control block (shm).

        Ray ends it: ray.kill on its own actor, a forced kill, in which no Python clean-up runs (no
        atexit, finally or finalizer), as with os._exit. But Ray then knows the death for an
        intended one. A process that exits by itself is a worker Ray lost, and its raylet pushes
        "A worker died or was killed ... SYSTEM_ERROR ... OOM killer" to the driver, which prints
        it: noise about a death the fault plan already reports. Until the kill lands (milliseconds)
        this thread blocks, and nothing else of the rank answers a peer: its acknowledgements and
        step words come from this thread's waits alone. Should Ray not end it in time, it exits by
        itself after all."""
        import ray
        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        except Exception:   # noqa: BLE001 - Ray cannot kill it (GCS unreachable): it dies anyway, below
            os._exit(CRASH_EXIT_STATUS)
        time.sleep(_KILL_WAIT_S)
        os._exit(CRASH_EXIT_STATUS)

    def _lost(self, dead) -> None:
        self.lost_world.add(self.transport.world_rank(dead))

    def _subgroup(self, sub_rank, topo, config, control, transport):
        return RayGroup(sub_rank, topo, config, None, control, transport, self.watch, lost_world=self.lost_world)
