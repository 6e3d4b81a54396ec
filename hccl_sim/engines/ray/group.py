"""One rank's Group (the engine contract, engines/base.py) inside its Ray actor.

Rendezvous: the rank's call (signature, entry clock, item size) goes through the control plane's
allgather (shared memory on one host, the peer transport across hosts); every rank then plans
the op itself, identically (planner + PlanCache), so there is no hub and no planning round trip.

Execution, by the data plane the cluster chose:
- on every plane, an op whose input is at most INLINE_BYTES is eager (MPI's eager protocol): the
  input travelled with the call, and every rank computes its own result from all inputs by the
  moves of the op's data program that decide it (programs.program_moves_for), so a small op costs
  one allgather;
- "shm" (every rank on one host), larger ops: ranks name their shared segments in an allgather,
  every rank runs its 1/p share of the op's data program on all ranks' buffers in place (the
  central data program), and a barrier closes the op;
- "socket" / "object" (ranks that share no memory), larger ops: the per-rank executor runs this
  rank's own schedule over the peer-to-peer transport (direct TCP, or Ray's object store); no rank
  touches another's data or computes another's result.
Point-to-point send/recv use the peer transport on every plane.

A sub-communicator's group (split, shrink: `subgroup`) runs on plane "peer": its members' scoped
view of the job's peer transport carries its control allgather and its data (per-rank executor).
"""
from __future__ import annotations

import math
import os
import re

import numpy as np
from hcomm.transports.scoped import ScopedTransport
from topologies.errors import HcclError

from .. import executors
from .. import rendezvous as rdv
from ..base import Call, RankBuffers
from ...planner import Signature, op_loops
from .control import ShmControl, TransportControl
from .protocol import CallPayload
from .watch import WatchedTransport

INLINE_BYTES = 64 << 10            # inputs up to this size travel in the control plane (eager ops)
CRASH_EXIT_STATUS = 70             # the exit status of a rank process the fault plan kills (EX_SOFTWARE)
_RETURNED = re.compile(r"rank (\d+) returned without calling it")   # hcomm.shm_control's wording


class RayGroup:
    def __init__(self, rank, topo, config, plane, control, transport, watch, shared=None, lost_world=None):
        self.rank, self.topo, self.config, self.size = rank, topo, config, topo.num_ranks
        self.plane, self.control, self.watch, self.shared = plane, control, watch, shared
        self._raw_transport = transport
        self.transport = WatchedTransport(transport, watch)
        self.scope = ""                    # this communicator's scope of the job's transport
        # the job's ranks a fault plan crashed in an op of this rank's communicators (shared with
        # its sub-communicators' groups): the driver takes those deaths for the plan's
        self.lost_world = set() if lost_world is None else lost_world
        self._plans = rdv.PlanCache(topo, config)
        self.fault_progress = self._plans.progress     # this rank's copy, advanced by its own plans
        self._seq = 0                      # the control plane's own sequence (several per collective)
        self.inline_bytes = min(INLINE_BYTES, control.max_payload)
        self.eager_bytes = self.inline_bytes       # MPI's eager protocol on every plane
        self._eager = None                 # every rank's eager input of the op being executed
        self._sig_bytes = {}               # signature -> its encoding (a loop calls the same op again)
        self._own = {}                     # (plan, shape, dtype, redop) -> (plan, its compiled OwnResult)

    # ---- the control plane -----------------------------------------------------------------------
    def _allgather(self, payload: bytes, what: str, op: str) -> list:
        seq = self._seq
        self._seq += 1
        with self.watch.waiting(what):
            return self.control.allgather(seq, payload, rdv.deadline(self.config), op)

    # ---- the contract ------------------------------------------------------------------------------
    def rendezvous(self, rank, call: Call):
        sig = call.signature
        op = rdv.opname(sig)
        eager = None if call.eager is None else np.ascontiguousarray(call.eager).tobytes()
        mine = self._sig_bytes.get(sig)
        if mine is None:
            if len(self._sig_bytes) > 256:
                self._sig_bytes.clear()
            mine = self._sig_bytes[sig] = CallPayload.signature_bytes(sig)
        try:
            raws = self._allgather(CallPayload(mine, call.clock, call.itemsize, eager, call.sent).encode(),
                                   f"{op} (collective #{call.seq})", op)
        except HcclError as exc:
            gone = _RETURNED.search(exc.reason)
            if gone is None:
                raise
            raise HcclError("E_PARA", rdv.returned_early_reason(sig, call.seq, int(gone.group(1))), rank=rank,
                            op=op) from None
        try:
            agreed = CallPayload.agreed(raws, rank, len(mine))
            if agreed is not None:
                # the same call everywhere (the common case) is the same bytes: only clocks differ
                clocks, sent, eagers = agreed
                plan = self._plans.agreed(sig, call.itemsize, clocks, sent)
            else:
                payloads = [CallPayload.decode(r) for r in raws]
                eagers = [c.eager for c in payloads]
                plan = self._plans.plan([Call(call.seq, c.signature_object(Signature), c.clock, c.itemsize,
                                              sent=c.sent) for c in payloads])
        except HcclError as exc:
            raise HcclError(exc.code, exc.reason, rank=rank, op=op, time_ns=exc.time_ns) from None
        self._eager = eagers if eager is not None else None
        return plan

    def execute(self, rank, seq, plan, buffers: RankBuffers, redop) -> None:
        coll = plan.collective
        if not coll.carries_data:
            return                          # a barrier: the rendezvous was it
        op = coll.method
        if self._eager is not None:          # every input came with the calls: only our own result
            raws, self._eager = self._eager, None
            self._own_result(rank, plan, buffers, raws, redop)
        elif self.plane != "shm":
            with self.watch.waiting(f"{op} (collective #{seq}) data"):
                executors.per_rank(rank, plan, buffers, redop, self.transport, self.size)
        else:
            self._shared_shares(rank, seq, plan, buffers, redop, op)

    def _own_result(self, rank, plan, buffers, raws, redop):
        """This rank's output from every rank's (eager) input: the moves that decide it, compiled
        once per plan (a loop of small ops repeats the same few)."""
        x = buffers.input
        base = getattr(plan, "plan", plan)          # a ShiftedPlan moves clocks, not data
        key = (id(base), x.shape, x.dtype.str, redop)
        got = self._own.get(key)
        if got is None or got[0] is not base:
            if len(self._own) >= 64:
                self._own.clear()
            got = self._own[key] = (base, executors.OwnResult(base, rank, self.size, x.shape, x.dtype, redop))
        got[1].run(b"".join(raws), buffers.output)

    def _shared_shares(self, rank, seq, plan, buffers, redop, op):
        bufs, descs, copy_back = self._shared_buffers(rank, seq, plan, buffers, op)
        executors.central_share(plan, bufs, redop, rank, self.size)
        self._allgather(b"", f"the other ranks' shares of {op} (collective #{seq})", op)
        if copy_back is not None:
            np.copyto(buffers.output, copy_back)
        self.shared.forget_except(descs)

    def _shared_buffers(self, rank, seq, plan, buffers, op):
        """Every rank's buffers of the op, mapped here (ranks name their segments in an allgather);
        the segment names; this rank's output view to copy back, or None."""
        p = self.size
        scratch_shape = plan.collective.scratch_shape(p, op_loops(plan.signature, p, buffers.input.itemsize,
                                                                  self.config))
        desc, copy_back = self.shared.describe(buffers, scratch_shape)
        descs = [type(desc).decode(r) for r in
                 self._allgather(desc.encode(), f"{op} (collective #{seq}) buffers", op)]
        return [self.shared.attach(d) for d in descs], descs, copy_back

    # ---- a fault plan's rank_crash (engines/base.py) ----------------------------------------------
    def die(self, rank, seq, plan, buffers, redop, steps) -> None:
        """This rank's process dies in this op, as a crashed one does: it moves the data of its
        first `steps` steps (its own schedule on the peer planes; its share of the data program
        up to its step `steps` on the shm plane), then exits at once: no goodbye to its peers, no
        clean-up, nothing flushed. Its peers find it by its closed connections (socket), its
        actor's death (object) or its process gone from the control block (shm)."""
        try:
            if steps and plan.collective.carries_data and self._eager is None:
                op = plan.collective.method
                if self.plane != "shm":
                    executors.per_rank(rank, plan, buffers, redop, self.transport, self.size, steps=steps)
                else:
                    bufs, _, _ = self._shared_buffers(rank, seq, plan, buffers, op)
                    executors.central_share(plan, bufs, redop, rank, self.size, until=(rank, steps))
        except BaseException:   # noqa: BLE001 - it dies anyway: what it was doing then does not matter
            pass
        os._exit(CRASH_EXIT_STATUS)

    def execute_lost(self, rank, seq, plan, buffers, redop, dead) -> None:
        """This rank's part of an op in which `dead` dies: run as usual until the data plane finds
        it gone. On the peer planes every wait fails once `dead` is lost (watch_peer), whichever
        peer it waits for; on the shm plane every rank waits for `dead` in the control block,
        which sees its process gone."""
        tr = self._raw_transport
        self.lost_world.add(tr.members[dead] if isinstance(tr, ScopedTransport) else dead)
        if self.plane == "shm":
            self.execute(rank, seq, plan, buffers, redop)
            return
        self.transport.watch_peer(dead)
        try:
            self.execute(rank, seq, plan, buffers, redop)
        finally:
            self.transport.unwatch_peer(dead)

    def result_array(self, shape, dtype):
        dtype = np.dtype(dtype)
        if self.plane != "shm" or math.prod(shape) * dtype.itemsize <= self.inline_bytes:
            return np.empty(shape, dtype=dtype)
        return self.shared.result_array(shape, dtype)

    def fail(self, rank, exc) -> None:
        self.control.abort("E_REMOTE", f"rank {rank} failed: {rdv.describe_failure(exc)}")

    def abort(self, rank, reason) -> None:
        """comm.abort(): this communicator's waits fail here and at every peer (its scope of the
        job's transport; the shared control block is the world communicator's alone)."""
        if isinstance(self.control, ShmControl):
            self.control.abort("E_REMOTE", reason)
        self.transport.abort_scope(self.scope, "E_REMOTE", reason)

    def subgroup(self, rank, members, scope, topo, config):
        """This rank's group of a sub-communicator: its members' view of the job's peer transport
        (hcomm.transports.scoped), the control plane an allgather over it, data by the per-rank
        executor (eager ops as here)."""
        transport = ScopedTransport(self._raw_transport, members, scope)
        sub_rank = tuple(members).index(rank)
        group = RayGroup(sub_rank, topo, config, "peer", TransportControl(transport, sub_rank, len(members)),
                         transport, self.watch, lost_world=self.lost_world)
        group.scope = scope
        return group

    def exit(self, rank) -> None:
        self.transport.mark_exited(rank)
