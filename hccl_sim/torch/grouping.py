"""How a hccl_sim group launches several ops as one: HCCL's group calls and torch's coalescing.

- `_grouped()`: the Communicator calls a job makes inside run as one HCCL group launch
  (`comm.group()`, HcclGroupStart / End), as torch_npu launches a coalesced op. Inside, a call's
  result is a Pending and the job's follow-up work on it (copies out, AVG's divide, an int32 copy
  back) is `_then`'s, run once the group has launched.
- `_group_start()` / `_group_end()`: torch_npu's backend methods of those names. The ops issued
  between them are held and launched by one job inside one HCCL group at `_group_end`; each keeps
  its own Work, complete when the group has launched (failed with the group's first failure).
  Sends and receives are not grouped here (hccl-sim's Communicator takes a group's sends and
  receives as send / recv, which a torch group issues as isend / irecv): refused inside.
- `start_coalescing` / `end_coalescing` (torch's `_coalescing_manager`, also under their
  underscored names, which torch 2.13 binds without forwarding to Python): the ops issued between
  them are one Work's.
"""
from __future__ import annotations

import contextlib

from topologies.errors import Cause, HcclError


class Grouping:
    """ProcessGroupHcclSim's group launches (see the module's docstring)."""

    @contextlib.contextmanager
    def _grouped(self):
        if self._grouping or not self.comm.topology.device_model.group_calls:
            yield                         # inside a group already (it launches), or 910A: one by one
            return
        self._grouping, self._deferred = True, []
        before = self.comm.last_op
        try:
            with self.comm.group():
                yield
        finally:
            self._grouping = False
        deferred, self._deferred = self._deferred, []
        if self.comm.last_op is not before:
            self.records.append(self.comm.last_op)
        for pending, follow_up in deferred:
            follow_up(None if pending is None else pending.wait())

    def _then(self, result, follow_up) -> None:
        """`follow_up(result)` now, or inside `_grouped` once the group has launched (`result` a
        Pending there, or None for a follow-up that needs no result)."""
        if self._grouping:
            self._deferred.append((result, follow_up))
        else:
            follow_up(result)

    # torch_npu's HcclGroupStart / HcclGroupEnd on the backend -----------------------------------------
    def _group_start(self):
        if self.world.timeline is not None:
            raise HcclError("E_NOT_SUPPORT", "_group_start under hccl_sim.torch.timeline(): a held op's simulated "
                            "end is not known until the group launches", rank=self.comm.rank, cause=Cause.BAD_INPUT)
        self._held_depth += 1
        if self._held is None:
            self._held = []

    def _group_end(self):
        if self._held is None:
            raise HcclError("E_PARA", "_group_end without _group_start", rank=self.comm.rank, cause=Cause.BAD_INPUT)
        self._held_depth -= 1
        if self._held_depth:
            return                        # nested: the outermost end launches, as HCCL's
        held, self._held = self._held, None

        def launch():
            done = []
            try:
                with self._grouped():
                    for job, fut in held:
                        done.append((job(), fut))
            except BaseException as exc:  # noqa: BLE001 - every held op fails with the group
                for _, fut in held:
                    self._worker.complete(fut, error=exc)
                raise
            for value, fut in done:
                self._worker.complete(fut, value)
        self._worker.submit(launch)

    def _hold(self, job):
        """While a group is open: keep `job` for `_group_end`; its Work."""
        fut, work = self._worker.held()
        self._held.append((job, fut))
        return work

    # torch's coalescing manager ----------------------------------------------------------------------
    @property
    def supports_coalescing(self):
        return True

    def start_coalescing(self, device):
        """The ops issued until end_coalescing are one Work's."""
        self._get_backend(device)
        self._worker.collect()

    def end_coalescing(self, device):
        """A Work that completes when every op issued since start_coalescing has."""
        self._get_backend(device)
        return self._worker.collected()

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing
