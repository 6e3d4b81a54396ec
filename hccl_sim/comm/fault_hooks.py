"""What a Communicator does where a fault plan meets one of its calls: a crash the plan puts in
the op (every rank told when HCCL would notice), and what the rank's call tells its peers about
its link setup under hbm_pressure entries (hccl_sim.faults.hbm).
"""
from __future__ import annotations

from topologies.errors import HcclError

from ..faults.fault_plan import RankCrashed
from ..faults.progress import EXCHANGE
from ..plan.faulted import crash_in, crash_steps


class FaultHooks:
    """Communicator's fault-plan hooks (a mixin: it reads the communicator's rank, group, device,
    topology, config and scope)."""

    def _meet_crash(self, faults, plan, seq, opname, buffers, redop):
        """A crash the fault plan puts in this op: the dead rank stops, every other rank fails when
        HCCL would notice (faults.BoundFaults.lost_error), at the same simulated time on every engine.

        An engine whose ranks are processes makes it real (the group's `die` and `execute_lost`):
        the dead rank's process moves the data of the steps it runs before it dies and exits (Ray)
        or stops the rank (MPI); the others run the op until their data plane finds the dead peer. In-process ranks move no data:
        the dead one raises RankCrashed (its result is None)."""
        crash = crash_in(faults, plan, seq, self.topology, self.config)
        if crash is None:
            return
        self._lost = crash
        group = self._group
        if crash[0] == self.rank:
            self.device.clock = max(self.device.clock, crash[1])
            group.die(self.rank, seq, plan.data, buffers, crash_steps(faults, plan, seq, self.topology, self.config))
            raise RankCrashed(self.rank, crash[1], opname)
        at, error = faults.lost_error(crash, plan, self.config, self.rank, opname)
        self.device.clock = max(self.device.clock, at)
        try:
            group.execute_lost(self.rank, seq, plan.data, buffers, crash[0])
        except HcclError as exc:            # how this rank found the dead one: the planned error stands
            raise error from exc
        raise error

    def _setup_word(self, seq: int, entry: int) -> int:
        """What this rank's call tells its peers about its link setup under hbm_pressure entries
        (hccl_sim.faults.progress.sent_by): which entry of its device's, if any, leaves the setup no
        memory at its entry, or that the call is a bootstrap exchange. An at_op entry holds from the
        rank's entry into that op of its world communicator."""
        pressure = self.device.pressure
        if pressure is None:
            return EXCHANGE if self._exchange else 0
        if not self.scope:
            pressure.enter_op(seq, entry)
        return EXCHANGE if self._exchange else pressure.starving(entry, self.device.allocator.free_bytes)
