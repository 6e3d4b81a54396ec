"""The engine-neutral half of a group whose ranks share no memory (comm/rank_group.py): Ray actors
and MPI processes both build their groups on it.

Rendezvous: the rank's call (signature, entry clock, item size) goes through the engine's
control plane, an allgather of small payloads (`control.allgather(seq, payload, deadline, op)`);
every rank then plans the op itself, identically (planner + PlanCache), so there is no hub and no
planning round trip.

Execution: an op whose input is at most `eager_bytes` is eager (MPI's eager protocol): the input
travelled with the call, and every rank computes its own result from all inputs by the moves of
the op's data program that decide it (hcomm.exec.own_result), so a small op costs one
allgather. Larger ops run on the group's one data plane (hcomm.exec's DataPlane, `plane`): by
default the per-rank executor over the peer transport (each rank runs its own schedule; no rank
touches another's data); ranks that share memory switch to the shared plane (every rank runs its
share of the central data program on every rank's buffers in place), ranks some of whose peers
share their host to the hosted one (`share_host`); results come from the plane's pool.

A fault plan's rank_crash (comm/rank_group.py) is one hook for every engine: the dead rank moves the
data of the steps it runs before it dies on its plane, then ends as its engine ends a rank
(`_end_rank`); its peers run their part until their plane finds it gone.

A sub-communicator's group (split, shrink: `subgroup`) is its members' scoped view of the job's
peer transport (hcomm.transports.scoped): its control plane a dissemination allgather over that
view (TransportControl), its data the per-rank executor.
"""
from __future__ import annotations

import math
import pickle
import struct

import numpy as np


from hcomm.transports.scoped import ScopedTransport
from topologies.errors import Cause, HcclError

from hcomm.control.rounds import GroupRounds
from hcomm.control.transport import TransportControl  # noqa: F401 - a sub-communicator's control plane
from hcomm.exec import HostedPlane, OwnResult, PerRankPlane, SharedPlane

from . import rendezvous as rdv
from .eager_lane import EagerLane
from ..comm.rank_group import Call, RankBuffers, RankGroup
from ..plan.planner import Signature

_CLOCK = struct.Struct("<q")
INLINE_BYTES = 64 << 10            # inputs up to this size travel in the control plane (eager ops)


class CallPayload:
    """A rank's call in the control plane's fixed binary layout: item size, the pickled signature,
    the entry clock, the rank's sends on the pairs its fault plan counts (Call.sent, int64s: none
    without a corrupt entry) and, for an eager op, its input's raw bytes (MPI's eager protocol).
    Everything before the clock is the same bytes on every rank that made the same call, so the
    common case is one prefix compare per rank and nothing to decode."""
    _HEAD = struct.Struct("<qIII")          # itemsize, signature bytes, eager bytes (or 2^32-1: none), sent counts
    _CLOCK = struct.Struct("<q")
    _NONE = 0xFFFFFFFF
    __slots__ = ("signature", "clock", "itemsize", "eager", "sent")

    def __init__(self, signature: bytes, clock: int, itemsize: int, eager, sent: tuple = ()):
        self.signature, self.clock, self.itemsize, self.eager, self.sent = signature, clock, itemsize, eager, sent

    @staticmethod
    def signature_bytes(signature) -> bytes:
        return pickle.dumps(tuple(signature), protocol=pickle.HIGHEST_PROTOCOL)

    def encode(self) -> bytes:
        head, _ = self.head(self.signature, self.itemsize, self.eager, self.sent)
        sent = struct.pack(f"<{len(self.sent)}q", *self.sent)
        return head + self._CLOCK.pack(self.clock) + sent + (self.eager or b"")

    @classmethod
    def decode(cls, raw: bytes) -> "CallPayload":
        itemsize, ns, ne, nsent = cls._HEAD.unpack_from(raw)
        at = cls._HEAD.size + ns
        clock, = cls._CLOCK.unpack_from(raw, at)
        sent = struct.unpack_from(f"<{nsent}q", raw, at + 8)
        at += 8 + 8 * nsent
        return cls(raw[cls._HEAD.size:cls._HEAD.size + ns], clock, itemsize,
                   None if ne == cls._NONE else raw[at:at + ne], sent)

    @classmethod
    def head(cls, signature: bytes, itemsize: int, eager, sent) -> tuple:
        """(the bytes before the clock of every payload of this call, its number of sent counts):
        a loop repeating a call encodes it once."""
        return (cls._HEAD.pack(itemsize, len(signature), cls._NONE if eager is None else len(eager), len(sent))
                + signature, len(sent))

    @classmethod
    def agreed(cls, raws: list, head: bytes, nsent: int):
        """(every rank's clock, every rank's sent counts, every rank's eager bytes joined in rank
        order) when every payload in `raws` starts with this rank's `head` (item size, signature,
        eager size and the number of sent counts equal as bytes: the same call), else None.

        A payload that starts with the head has the head's length (the head holds every length),
        so where every one does the payloads joined are records of one layout: one join and one
        unpack read them all (a loop of small ops runs this at every op, with cold caches)."""
        size = len(raws[0])
        joined = b"".join(raws)
        if len(joined) != size * len(raws) or size < len(head) + 8 + 8 * nsent:
            return None
        # (struct keeps the compiled layouts of the formats it has seen)
        heads, clocks, sent, eagers = zip(*struct.iter_unpack(
            f"<{len(head)}sq{8 * nsent}s{size - len(head) - 8 - 8 * nsent}s", joined))
        if heads.count(head) != len(raws):
            return None
        return clocks, [struct.unpack(f"<{nsent}q", s) for s in sent] if nsent else None, b"".join(eagers)

    def signature_object(self, signature_type):
        return signature_type(*pickle.loads(self.signature))




class PeerGroup(RankGroup):
    """One rank's group: rendezvous over `control`, data over `transport` (see the module
    docstring). `raw_transport` is the job's transport under any wrapper (a sub-communicator
    scopes that one); subclasses add their data planes and fault hooks."""

    engine = "peer"                        # subclasses name theirs
    pooled_result_bytes = None             # results at least this large come from a pool (None: never)

    def __init__(self, rank, topo, config, control, transport, raw_transport=None, watch=None):
        self.rank, self.topo, self.config, self.size = rank, topo, config, topo.num_ranks
        self.control = control
        self.rounds = GroupRounds(control, config.wait_timeout_s, watch)
        self.plain_result_bytes = self.pooled_result_bytes or 0
        self.transport = transport
        self._raw_transport = transport if raw_transport is None else raw_transport
        self.plane = PerRankPlane(transport, rank, self.rounds.waiting)     # the group's one DataPlane
        self.scope = ""                    # this communicator's scope of the job's transport
        self._plans = rdv.PlanCache(topo, config)
        self.fault_progress = self._plans.progress     # this rank's copy, advanced by its own plans
        self.inline_bytes = min(INLINE_BYTES, control.max_payload)
        self.eager_bytes = self.inline_bytes       # MPI's eager protocol on every plane
        self._eager = None                 # every rank's eager input of the op being executed
        self._heads = {}                   # id(signature) -> CallPayload.head + (signature, its shape key)
        self._own = {}                     # (id(data program), shape, dtype) -> (it, its compiled OwnResult)
        self._lanes = {}                   # id(signature) -> its EagerLane (eager_op)

    @property
    def data_plane(self) -> str:
        """The name of the plane execute() moves bytes on (comm.data_plane)."""
        return self.plane.name

    def _use_shared_plane(self, memory, local: int = 0, pooled_result_bytes=None) -> None:
        """Run larger ops on the shared-memory plane over `memory` (a MemoryProvider; `local`: this
        rank among its process's); results of at least `pooled_result_bytes` come from its pool
        (default: every result past the eager size, which peers then write in place)."""
        self.plane = SharedPlane(self.rounds, memory, self.rank, self.size, local)
        self.pooled_result_bytes = self.plain_result_bytes = (
            self.inline_bytes + 1 if pooled_result_bytes is None else pooled_result_bytes)

    def share_host(self, memory, ranks) -> None:
        """`ranks` (this one among them) share this rank's host: run larger ops by the per-rank
        executor with this rank's buffers in `memory`'s segments (a SegmentProvider), the
        transport sending those peers the places of slices instead of their bytes, and take
        results from its pool, which peers then read in place."""
        self._raw_transport.share_host(memory, ranks)
        self.plane = HostedPlane(self.transport, self.rank, memory, self.rounds.waiting)
        self.pooled_result_bytes = self.plain_result_bytes = self.inline_bytes + 1

    # ---- the contract ------------------------------------------------------------------------------
    def rendezvous(self, rank, call: Call):
        eager = None if call.eager is None else call.eager.tobytes()     # C order, whatever the strides
        head = self._head(call, eager)
        payload = head[0] + _CLOCK.pack(call.clock)
        if call.sent:
            payload += struct.pack(f"<{len(call.sent)}q", *call.sent)
        if eager is not None:
            payload += eager
        return self._agree(rank, call, self._meet(rank, call, payload), head, eager is not None)

    def _head(self, call: Call, eager):
        """(CallPayload.head of the call, its number of sent counts, the signature, its shape key),
        kept by the signature object's identity (a loop's Communicator hands the same one again;
        the entry holds it, so its id is not reused), checked, then by what else shapes the head."""
        sig = call.signature
        shape = (call.itemsize, -1 if eager is None else len(eager), len(call.sent))
        head = self._heads.get(id(sig))
        if head is None or head[2] is not sig or head[3] != shape:
            if len(self._heads) > 256:
                self._heads.clear()
            head = self._heads[id(sig)] = CallPayload.head(CallPayload.signature_bytes(sig), call.itemsize, eager,
                                                           call.sent) + (sig, shape)
        return head

    def _meet(self, rank, call: Call, payload: bytes, op=None, layout=None) -> list:
        """Every rank's payload of this call's control round (`op`: the call's op name, if known);
        with `layout` (the payload's record struct), as GroupRounds.allgather_records gives them:
        (columns, None) or (None, list)."""
        op = op or rdv.opname(call.signature)
        try:
            if layout is not None:
                return self.rounds.allgather_records(payload, layout, (op, call.seq), op)
            return self.rounds.allgather(payload, (op, call.seq), op)
        except HcclError as exc:
            # a control plane's "rank N returned without calling it": said as every engine says it
            if exc.cause != Cause.PEER_RETURNED or exc.detail.get("missed") != "call" or exc.peer is None:
                raise
            raise rdv.returned_early_error(rank, op, call.seq, exc.peer) from None

    def _agree(self, rank, call: Call, raws: list, head, eager: bool):
        """The plan of every rank's call (`raws`, their payloads), or the error naming how they differ."""
        sig = call.signature
        try:
            agreed = CallPayload.agreed(raws, head[0], head[1])
            if agreed is not None:
                # the same call everywhere (the common case) is the same bytes: only clocks differ
                clocks, sent, eagers = agreed
                plan = self._plans.agreed(sig, call.itemsize, clocks, sent, key=head[0])
            else:
                payloads = [CallPayload.decode(r) for r in raws]
                eagers = b"".join([c.eager or b"" for c in payloads])
                plan = self._plans.plan([Call(call.seq, c.signature_object(Signature), c.clock, c.itemsize,
                                              sent=c.sent) for c in payloads])
        except HcclError as exc:
            raise exc.replace(rank=rank, op=rdv.opname(sig)) from None
        self._eager = eagers if eager else None
        return plan

    def eager_op(self, rank, call: Call, out):
        """Both phases of an eager call or a barrier (comm/rank_group.py); a repeat of a call whose
        first run left an EagerLane takes the lane's lean path (engines/eager_lane.py)."""
        sig, x = call.signature, call.eager
        lane = self._lanes.get(id(sig))
        nbytes = 0 if x is None else x.nbytes
        if lane is None or lane.signature is not sig or lane.eager_bytes != nbytes:
            plan = self.rendezvous(rank, call)
            travelled = self._eager is not None
            self.execute(rank, call.seq, plan.data, RankBuffers(x, out, None))
            end = plan.exit_of(rank)
            if (travelled or x is None) and not call.sent:
                if len(self._lanes) >= 64:
                    self._lanes.clear()
                lane = self._lanes[id(sig)] = EagerLane(sig, rdv.opname(sig), self._heads[id(sig)][0], nbytes)
                lane.keep(plan.entry, plan, end, None if x is None else self._own_for(rank, plan.data, x, out))
            return plan, end
        record = lane.record
        columns, raws = self._meet(rank, call, record.pack(lane.head, call.clock, b"" if x is None else x.tobytes()),
                                   lane.op, record)
        if columns is None:
            agreed = CallPayload.agreed(raws, lane.head, 0)   # (clocks, None, inputs) when every call is this one
        elif columns[0].count(lane.head) == self.size:       # every rank's call is this one
            agreed = (columns[1], None, b"".join(columns[2]))
        else:
            agreed = None
        hit = None if agreed is None else lane.plan_at(agreed[0])
        if hit is not None:
            if hit[2] is not None:
                hit[2].run(agreed[2], out)
            return hit[0], hit[1]
        # another call somewhere, or clocks not seen yet: the general way
        if raws is None:
            raws = [record.pack(*fields) for fields in zip(*columns)]
        plan = self._agree(rank, call, raws, self._head(call, None if x is None else x.tobytes()), x is not None)
        eagers, self._eager = self._eager, None
        end, own = plan.exit_of(rank), None if x is None else self._own_for(rank, plan.data, x, out)
        if agreed is not None:
            lane.keep(agreed[0], plan, end, own)
        if own is not None:
            own.run(eagers, out)
        return plan, end

    def execute(self, rank, seq, data, buffers: RankBuffers) -> None:
        raws = self._eager
        if raws is not None:                 # every input came with the calls: only our own result
            self._eager = None
            self._own_result(rank, data, buffers, raws)
            return
        if data.carries_data:                # (a barrier: the rendezvous was it)
            self.plane.run(seq, data, buffers)

    def result_array(self, shape, dtype):
        """Results at least `pooled_result_bytes`: the plane's (a shared plane's pool, which peers
        write in place; a pool of host arrays); smaller ones, and past a full pool, plain arrays."""
        limit = self.pooled_result_bytes
        if limit is not None and math.prod(shape) * np.dtype(dtype).itemsize >= limit:
            arr = self.plane.result(shape, dtype)
            if arr is not None:
                return arr
        return np.empty(shape, dtype=dtype)

    def writes_in_place(self, out) -> bool:
        """On the shared plane, an op larger than the eager size writes an `out=` that lies in the
        shared memory (a device array's data, a pooled result) in place: peers write it there."""
        return out.nbytes > self.eager_bytes and self.plane.holds(out)

    # ---- a fault plan's rank_crash (comm/rank_group.py) -------------------------------------------------
    def die(self, rank, seq, data, buffers, steps) -> None:
        """This rank dies in this op: it moves the data of its first `steps` steps (its share of
        the data program up to its step `steps` on the shared plane, its own schedule over the
        transport otherwise), then ends as its engine ends a rank (`_end_rank`)."""
        try:
            if data.carries_data and self._eager is None:
                self.plane.run(seq, data, buffers, steps=steps)
        except HcclError:
            pass                # it dies anyway: what it was waiting for then does not matter
        self._end_rank(rank)

    def _end_rank(self, rank) -> None:
        """How the engine ends a rank the fault plan crashes."""
        raise self._not_offered("rank_crash")

    def execute_lost(self, rank, seq, data, buffers, dead) -> None:
        """This rank's part of an op in which `dead` dies: as usual, until its plane finds `dead`
        gone: a control round meets its LOST marker (the shared plane), or every wait fails once
        it is lost (watch_peer), whichever peer it waits for."""
        self._lost(dead)
        if self._eager is not None or not data.carries_data:
            self.execute(rank, seq, data, buffers)      # nothing to wait for
        else:
            self.plane.run_lost(seq, data, buffers, dead)

    def _lost(self, dead) -> None:
        """`dead` (a rank of this group) dies in this op (the Ray engine tells its driver)."""

    def _own_result(self, rank, data, buffers, raws):
        """This rank's output from every rank's (eager) input (`raws`: their bytes joined in rank order)."""
        self._own_for(rank, data, buffers.input, buffers.output).run(raws, buffers.output)

    def _own_for(self, rank, data, x, out):
        """The moves that decide this rank's output of `data` (hcomm.exec.OwnResult), compiled once
        per plan (a loop of small ops repeats the same few)."""
        key = (id(data), x.shape, x.dtype)
        got = self._own.get(key)
        if got is None or got[0] is not data:
            if len(self._own) >= 64:
                self._own.clear()
            got = self._own[key] = (data, OwnResult(data, rank, x.shape, out.shape, x.dtype))
        return got[1]

    def fail(self, rank, exc) -> None:
        self.control.abort("E_REMOTE", f"rank {rank} failed: {rdv.describe_failure(exc)}")

    def abort(self, rank, reason) -> None:
        """comm.abort(): this communicator's waits fail here and at every peer: its control rounds
        where its plane holds them apart (a shared block, MPI's), then its scope of the job's
        transport."""
        self.control.abort_for_communicator("E_REMOTE", reason)
        # the control rounds this rank finished are not failed at its peers (AbortState)
        self.transport.abort_scope(self.scope, "E_REMOTE", reason, after=self.rounds.seq)

    def subgroup(self, rank, members, scope, topo, config):
        """This rank's group of a sub-communicator: its members' view of the job's peer transport
        (hcomm.transports.scoped), the control plane an allgather over it, data by the per-rank
        executor (eager ops as here)."""
        transport = ScopedTransport(self._raw_transport, members, scope)
        sub_rank = tuple(members).index(rank)
        group = self._subgroup(sub_rank, topo, config, TransportControl(transport, sub_rank, len(members)),
                               transport)
        group.scope = scope
        group.ranks_per_process = self.ranks_per_process
        return group

    def _subgroup(self, sub_rank, topo, config, control, transport) -> "PeerGroup":
        return PeerGroup(sub_rank, topo, config, control, transport)

    def exit(self, rank) -> None:
        self.transport.mark_exited(rank)
