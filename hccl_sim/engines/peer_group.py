"""The engine-neutral half of a group whose ranks share no memory (engines/base.py): Ray actors
and MPI processes both build their groups on it.

Rendezvous: the rank's call (signature, entry clock, item size) goes through the engine's
control plane, an allgather of small payloads (`control.allgather(seq, payload, deadline, op)`);
every rank then plans the op itself, identically (planner + PlanCache), so there is no hub and no
planning round trip.

Execution: an op whose input is at most `eager_bytes` is eager (MPI's eager protocol): the input
travelled with the call, and every rank computes its own result from all inputs by the moves of
the op's data program that decide it (hcomm.exec.own_result), so a small op costs one
allgather. Larger ops run on the engine's data plane: by default the per-rank executor over the
peer transport (each rank runs its own schedule; no rank touches another's data); an engine with
a shared-memory plane overrides `_execute_data`.

A sub-communicator's group (split, shrink: `subgroup`) is its members' scoped view of the job's
peer transport (hcomm.transports.scoped): its control plane a dissemination allgather over that
view (TransportControl), its data the per-rank executor.
"""
from __future__ import annotations

import contextlib
import pickle
import struct


from hcomm.transports.scoped import ScopedTransport
from topologies.errors import Cause, HcclError

from hcomm.control.transport import TransportControl  # noqa: F401 - a sub-communicator's control plane
from hcomm.exec import OwnResult, run_rank

from . import rendezvous as rdv
from .base import Call, Group, RankBuffers
from ..plan.planner import Signature

_NO_WATCH = contextlib.nullcontext()      # stateless: one serves every wait
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
        """(every rank's clock, every rank's sent counts, every rank's eager bytes) when every
        payload in `raws` starts with this rank's `head` (item size, signature, eager size and the
        number of sent counts equal as bytes: the same call), else None."""
        for r in raws:
            if not r.startswith(head):
                return None
        at = len(head)
        unpack = cls._CLOCK.unpack_from
        clocks = [unpack(r, at)[0] for r in raws]
        at += 8
        sent = [struct.unpack_from(f"<{nsent}q", r, at) for r in raws] if nsent else None
        at += 8 * nsent
        return clocks, sent, [r[at:] for r in raws]

    def signature_object(self, signature_type):
        return signature_type(*pickle.loads(self.signature))




class PeerGroup(Group):
    """One rank's group: rendezvous over `control`, data over `transport` (see the module
    docstring). `raw_transport` is the job's transport under any wrapper (a sub-communicator
    scopes that one); subclasses add their data planes and fault hooks."""

    engine = "peer"                        # subclasses name theirs
    data_plane = "peer"

    def __init__(self, rank, topo, config, control, transport, raw_transport=None):
        self.rank, self.topo, self.config, self.size = rank, topo, config, topo.num_ranks
        self.control = control
        self.transport = transport
        self._raw_transport = transport if raw_transport is None else raw_transport
        self.scope = ""                    # this communicator's scope of the job's transport
        self._plans = rdv.PlanCache(topo, config)
        self.fault_progress = self._plans.progress     # this rank's copy, advanced by its own plans
        self._seq = 0                      # the control plane's own sequence (several per collective)
        self.inline_bytes = min(INLINE_BYTES, control.max_payload)
        self.eager_bytes = self.inline_bytes       # MPI's eager protocol on every plane
        self._eager = None                 # every rank's eager input of the op being executed
        self._heads = {}                   # id(signature) -> CallPayload.head + (signature, its shape key)
        self._own = {}                     # (id(data program), shape, dtype) -> (it, its compiled OwnResult)

    # ---- the control plane -----------------------------------------------------------------------
    def _waiting(self, what: str):
        """A context around every blocking wait (the Ray engine records it for its stall watch)."""
        return _NO_WATCH

    def _allgather(self, payload: bytes, what: str, op: str) -> list:
        seq = self._seq
        self._seq += 1
        with self._waiting(what):
            return self.control.allgather(seq, payload, rdv.deadline(self.config), op)

    # ---- the contract ------------------------------------------------------------------------------
    def rendezvous(self, rank, call: Call):
        sig = call.signature
        op = rdv.opname(sig)
        eager = None if call.eager is None else call.eager.tobytes()     # C order, whatever the strides
        sent = call.sent
        # by the signature object's identity (a loop's Communicator hands the same one again; the
        # entry holds it, so its id is not reused), checked, then by what else shapes the head
        shape = (call.itemsize, -1 if eager is None else len(eager), len(sent))
        head = self._heads.get(id(sig))
        if head is None or head[2] is not sig or head[3] != shape:
            if len(self._heads) > 256:
                self._heads.clear()
            head = self._heads[id(sig)] = CallPayload.head(CallPayload.signature_bytes(sig), call.itemsize, eager,
                                                           sent) + (sig, shape)
        payload = head[0] + _CLOCK.pack(call.clock)
        if sent:
            payload += struct.pack(f"<{len(sent)}q", *sent)
        if eager is not None:
            payload += eager
        try:
            raws = self._allgather(payload, f"{op} (collective #{call.seq})", op)
        except HcclError as exc:
            # a control plane's "rank N returned without calling it": said as every engine says it
            if exc.cause != Cause.PEER_RETURNED or exc.detail.get("missed") != "call" or exc.peer is None:
                raise
            raise rdv.returned_early_error(rank, op, call.seq, exc.peer) from None
        try:
            agreed = CallPayload.agreed(raws, head[0], head[1])
            if agreed is not None:
                # the same call everywhere (the common case) is the same bytes: only clocks differ
                clocks, sent, eagers = agreed
                plan = self._plans.agreed(sig, call.itemsize, clocks, sent, key=head[0])
            else:
                payloads = [CallPayload.decode(r) for r in raws]
                eagers = [c.eager for c in payloads]
                plan = self._plans.plan([Call(call.seq, c.signature_object(Signature), c.clock, c.itemsize,
                                              sent=c.sent) for c in payloads])
        except HcclError as exc:
            raise exc.replace(rank=rank, op=op) from None
        self._eager = eagers if eager is not None else None
        return plan

    def execute(self, rank, seq, data, buffers: RankBuffers) -> None:
        raws = self._eager
        if raws is not None:                 # every input came with the calls: only our own result
            self._eager = None
            self._own_result(rank, data, buffers, raws)
            return
        if data.carries_data:                # (a barrier: the rendezvous was it)
            self._execute_data(rank, seq, data, buffers)

    def _execute_data(self, rank, seq, data, buffers) -> None:
        """A larger op's data: this rank's own schedule over the peer transport."""
        with self._waiting(f"{data.name} (collective #{seq}) data"):
            run_rank(data, rank, buffers, self.transport)

    def _own_result(self, rank, data, buffers, raws):
        """This rank's output from every rank's (eager) input: the moves that decide it, compiled
        once per plan (a loop of small ops repeats the same few)."""
        x, out = buffers.input, buffers.output
        key = (id(data), x.shape, x.dtype)
        got = self._own.get(key)
        if got is None or got[0] is not data:
            if len(self._own) >= 64:
                self._own.clear()
            got = self._own[key] = (data, OwnResult(data, rank, x.shape, out.shape, x.dtype))
        got[1].run(b"".join(raws), buffers.output)

    def fail(self, rank, exc) -> None:
        self.control.abort("E_REMOTE", f"rank {rank} failed: {rdv.describe_failure(exc)}")

    def abort(self, rank, reason) -> None:
        """comm.abort(): this communicator's waits fail here and at every peer (its scope of the
        job's transport)."""
        self.transport.abort_scope(self.scope, "E_REMOTE", reason)

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
