"""One rank's Group (the engine contract, engines/base.py) inside its Ray actor.

The engine-neutral part (rendezvous over the control plane's allgather, planning on every rank,
eager small ops, the per-rank executor over the peer transport, sub-communicators) is
engines/peer_group.py's PeerGroup. What is Ray's own:
- the control plane: shared memory on one host (ShmControl), the peer transport across hosts;
- the data plane "shm" (every rank on one host), larger ops: engines/shm_plane.py's SharedPlane
  (every rank runs its 1/p share of the central data program on all ranks' buffers in place); "socket" / "object" (ranks
  that share no memory) run the per-rank executor over direct TCP or Ray's object store;
- the stall watch (every wait recorded for the driver's deadlock verdict) and a fault plan's
  rank_crash (the dead rank's process exits; its peers find it gone).
Point-to-point send/recv use the peer transport on every plane.
"""
from __future__ import annotations

import os

import numpy as np
from hcomm.transports.scoped import ScopedTransport

from hcomm.exec import run_rank, run_share
from ..peer_group import PeerGroup
from ..shm_plane import SharedPlane
from hcomm.control.shm import ShmControl
from hcomm.transports.watched import WatchedTransport

CRASH_EXIT_STATUS = 70             # the exit status of a rank process the fault plan kills (EX_SOFTWARE)


class RayGroup(SharedPlane, PeerGroup):
    engine = "ray"

    def __init__(self, rank, topo, config, data_plane, control, transport, watch, shared=None, lost_world=None):
        super().__init__(rank, topo, config, control, WatchedTransport(transport, watch), raw_transport=transport)
        self.data_plane, self.watch, self.shared = data_plane, watch, shared
        # the job's ranks a fault plan crashed in an op of this rank's communicators (shared with
        # its sub-communicators' groups): the driver takes those deaths for the plan's
        self.lost_world = set() if lost_world is None else lost_world

    def _waiting(self, what):
        return self.watch.waiting(what)

    def _execute_data(self, rank, seq, data, buffers):
        if self.data_plane != "shm":
            super()._execute_data(rank, seq, data, buffers)
        else:
            self._shared_shares(rank, seq, data, buffers)

    # ---- a fault plan's rank_crash (engines/base.py) ----------------------------------------------
    def die(self, rank, seq, data, buffers, steps) -> None:
        """This rank's process dies in this op, as a crashed one does: it moves the data of its
        first `steps` steps (its own schedule on the peer planes; its share of the data program
        up to its step `steps` on the shm plane), then exits at once: no goodbye to its peers, no
        clean-up, nothing flushed. Its peers find it by its closed connections (socket), its
        actor's death (object) or its process gone from the control block (shm)."""
        try:
            if steps and data.carries_data and self._eager is None:
                if self.data_plane != "shm":
                    run_rank(data, rank, buffers, self.transport, steps=steps)
                else:
                    bufs, _, _ = self._shared_buffers(rank, seq, data, buffers)
                    run_share(data, bufs, rank, self.size, until=(rank, steps))
        except BaseException:   # noqa: BLE001 - it dies anyway: what it was doing then does not matter
            pass
        os._exit(CRASH_EXIT_STATUS)

    def execute_lost(self, rank, seq, data, buffers, dead) -> None:
        """This rank's part of an op in which `dead` dies: run as usual until the data plane finds
        it gone. On the peer planes every wait fails once `dead` is lost (watch_peer), whichever
        peer it waits for; on the shm plane every rank waits for `dead` in the control block,
        which sees its process gone."""
        tr = self._raw_transport
        self.lost_world.add(tr.members[dead] if isinstance(tr, ScopedTransport) else dead)
        if self.data_plane == "shm":
            self.execute(rank, seq, data, buffers)
            return
        self.transport.watch_peer(dead)
        try:
            self.execute(rank, seq, data, buffers)
        finally:
            self.transport.unwatch_peer(dead)

    def result_array(self, shape, dtype):
        if self.data_plane != "shm":
            return np.empty(shape, dtype=dtype)
        return self._shared_result(shape, dtype)

    def abort(self, rank, reason) -> None:
        """comm.abort(): this communicator's waits fail here and at every peer (its scope of the
        job's transport; the shared control block is the world communicator's alone)."""
        if isinstance(self.control, ShmControl):
            self.control.abort("E_REMOTE", reason)
        super().abort(rank, reason)

    def _subgroup(self, sub_rank, topo, config, control, transport):
        return RayGroup(sub_rank, topo, config, "peer", control, transport, self.watch, lost_world=self.lost_world)
