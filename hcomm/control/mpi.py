"""The control plane of ranks that are MPI processes: the allgather of small payloads that every rendezvous of the
world communicator is.

The ranks of one process (ranks_per_process threads) first meet among themselves; the last to
arrive runs one MPI allgather for the process (the hub's `ctl_allgather`, transports.mpi.hub_allgather: MPI's
persistent allgather of fixed-size slots, polled against the deadline) and hands every rank its
share. So an eager small op costs one MPI allgather whatever the number of ranks per process.

An MPI job of one node whose processes host one rank each meets instead in a shared-memory
ControlBlock (`host_block`, `HostBlockControl`), as Ray's and torchrun's ranks of one host do,
unless its fault plan crashes ranks (their processes live on, and only these rounds carry their
LOST markers).

A rank that returned or failed takes no more calls, but its process still has to answer its
peers: from then on the process contributes a marker in its place to every allgather (and, once
all its ranks are done, posts one such round unasked, which `MpiHub.close` evens out if nobody
needed it). A peer meeting a marker fails at once with the wording every engine uses ("rank N
returned without calling it", "rank N failed: ...", "lost rank N: ..." for a rank a fault plan
crashed), instead of waiting for its deadline.
"""
from __future__ import annotations

import struct
import threading
import time

from topologies.errors import Cause, HcclError

from ..memory import segments as shm
from ..transports.mpi.hub_allgather import SLOT_BYTES
from .base import ControlPlane
from .nodes import PAYLOAD_BYTES
from .shm import ControlBlock
from .shm_plane import ShmControl

CALL, LEFT, FAILED, LOST = 0, 1, 2, 3
_LEN = struct.Struct("<BI")


def _pack(items) -> bytes:
    return b"".join(_LEN.pack(kind, len(b)) + b for kind, b in items)


def _unpack(blob: bytes, k: int) -> list:
    out, at = [], 0
    for _ in range(k):
        kind, n = _LEN.unpack_from(blob, at)
        at += _LEN.size
        out.append((kind, blob[at:at + n]))
        at += n
    return out


class _Round:
    __slots__ = ("items", "result", "error", "readers", "running")

    def __init__(self, k):
        self.items = [None] * k
        self.result = self.error = None
        self.readers = 0
        self.running = False           # a rank of the process runs it in MPI (its outcome is everyone's)


class MpiControl:
    """One process's side of the world communicator's control plane (`view(rank)` per rank)."""

    max_payload = 1 << 30

    def __init__(self, hub, wait_timeout_s: float):
        """`wait_timeout_s`: HCCL_EXEC_TIMEOUT, the deadline of a round this process runs unasked
        (0: none)."""
        self.hub, self.wait_timeout_s, self.k = hub, wait_timeout_s, hub.k
        self.base = hub.proc * hub.k
        self._cond = threading.Condition()
        self._rounds = {}
        self._done = {}                    # local index -> (LEFT | FAILED, marker bytes)
        self._next = 0                     # the next round this process will run
        self._aborted = None
        hub.on_abort.append(self._on_abort)

    def view(self, rank: int) -> "RankControl":
        return RankControl(self, rank)

    def _on_abort(self, code, reason, rounds=None):
        with self._cond:
            if self._aborted is None or rounds is None or (self._aborted[2] is not None and rounds < self._aborted[2]):
                self._aborted = (code, reason, rounds)
            self._cond.notify_all()

    def _stopped(self):
        """The abort that fails a round not yet posted, or None: a local one, or one from a process
        that had posted no more control rounds than this one has (it will not post the next)."""
        got = self._aborted
        if got is not None and (got[2] is None or self.hub.rounds_posted >= got[2]):
            return got
        return None

    def allgather(self, local: int, seq: int, payload: bytes, deadline, op) -> list:
        if self.k == 1:                  # a lone rank: no meeting of threads, one MPI round
            return self._alone(seq, payload, deadline, op)
        with self._cond:
            rnd = self._rounds.setdefault(seq, _Round(self.k))
            rnd.items[local] = (CALL, payload)
            lead = self._fill(seq, rnd)
            while not lead and rnd.result is None and rnd.error is None:
                got = None if rnd.running else self._stopped()   # a running round ends by the hub's rule
                if got is not None:
                    raise HcclError(got[0], f"aborted: {got[1]}", rank=self.base + local, op=op, cause=Cause.ABORTED)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise HcclError("E_TIMEOUT", f"ranks of this MPI process did not call collective round {seq} "
                                    f"within {self.wait_timeout_s} s (HCCL_EXEC_TIMEOUT)",
                                    rank=self.base + local, op=op, cause=Cause.TIMEOUT)
                self._cond.wait(0.05 if left is None else min(0.05, left))
        if lead:
            self._run(seq, rnd, deadline, op)
        with self._cond:
            rnd.readers += 1
            if rnd.readers == sum(1 for kind, _ in rnd.items if kind == CALL):
                self._rounds.pop(seq, None)
        if rnd.error is not None:
            raise rnd.error.replace(rank=self.base + local, op=op)
        return self.decide(rnd.result, seq, self.base + local, op)

    def _take_round(self, seq, op) -> None:
        """A lone rank's round `seq` is the process's next; it fails if the job was aborted."""
        if seq != self._next:
            raise HcclError("E_INTERNAL", f"control round {seq} out of order (next {self._next})", rank=self.base, op=op)
        self._next = seq + 1
        got = self._stopped() if self._aborted is not None else None
        if got is not None:
            raise HcclError(got[0], f"aborted: {got[1]}", rank=self.base, op=op, cause=Cause.ABORTED)

    def _alone(self, seq, payload, deadline, op=None) -> list:
        self._take_round(seq, op)
        try:
            blobs = self.hub.ctl_allgather(_LEN.pack(CALL, len(payload)) + payload, deadline,
                                           lambda: f"collective round {seq} ({op})")
        except HcclError as exc:
            raise exc.replace(rank=self.base, op=op) from None
        return self._bodies(blobs, seq, op)

    def _alone_records(self, seq, payload, layout, deadline, op=None):
        """ControlPlane.allgather_records of a lone rank: the hub unpacks every process's call
        from its slot in the round's buffer, behind the (kind, length) head a call has."""
        self._take_round(seq, op)
        try:
            columns, blobs = self.hub.ctl_allgather_records(_LEN.pack(CALL, len(payload)), payload, layout, deadline,
                                                            lambda: f"collective round {seq} ({op})")
        except HcclError as exc:
            raise exc.replace(rank=self.base, op=op) from None
        if columns is not None:
            return columns, None
        return None, self._bodies(blobs, seq, op)

    def _bodies(self, blobs, seq, op) -> list:
        """Every lone rank's payload from its process's blob (a cut one: empty), or the error a
        rank's marker says."""
        bodies, at = [], _LEN.size
        for b in blobs:                  # one (kind, length) head and body per process
            if b is None:
                bodies.append(b"")
            elif b[0] == CALL:
                bodies.append(b[at:])
            else:
                return self.decide([(CALL, b"") if b is None else (b[0], b[at:]) for b in blobs], seq, self.base, op)
        return bodies

    def _fill(self, seq, rnd) -> bool:
        """Markers for the process's finished ranks; True when this caller completes the round
        (the lock held), which it then runs for the process."""
        for j, marker in self._done.items():
            if rnd.items[j] is None:
                rnd.items[j] = marker
        if any(item is None for item in rnd.items) or seq != self._next:
            return False
        self._next += 1
        rnd.running = True
        return True

    def _run(self, seq, rnd, deadline, op) -> None:
        try:
            blobs = self.hub.ctl_allgather(_pack(rnd.items), deadline, lambda: f"collective round {seq} ({op})")
            # a cut blob (None): a process whose ranks are all done ended the round early; its
            # markers decide the round, the cut calls are never read
            result = [item for b in blobs for item in (_unpack(b, self.k) if b is not None
                                                       else [(CALL, b"")] * self.k)]
        except HcclError as exc:
            result, rnd.error = None, exc
        with self._cond:
            rnd.result = result
            self._cond.notify_all()

    @staticmethod
    def decide(items, seq, rank, op) -> list:
        for r, (kind, body) in enumerate(items):
            if kind == LEFT:
                raise HcclError("E_PARA", f"collective round {seq}: rank {r} returned without calling it",
                                rank=rank, op=op, cause=Cause.PEER_RETURNED, peers=(r,), detail={"missed": "call"})
            if kind == FAILED:
                raise HcclError("E_REMOTE", f"aborted: rank {r} failed: {body.decode(errors='replace')}",
                                rank=rank, op=op, cause=Cause.PEER_FAILED, peers=(r,))
            if kind == LOST:
                raise HcclError("E_REMOTE", f"collective round {seq}: lost rank {r}: {body.decode(errors='replace')}",
                                rank=rank, op=op, cause=Cause.PEER_LOST, peers=(r,))
        return [body for _, body in items]

    def finish(self, local: int, failure: str | None, lost: str | None = None) -> None:
        """Rank `local` of this process takes no more calls (it returned, failed with `failure`, or
        the fault plan crashed it: `lost`, why). Its pending peers' rounds complete with its marker;
        once every rank of the process is done the process posts one marker round unasked (a peer
        may be waiting in it)."""
        with self._cond:
            if lost is not None:
                marker = (LOST, lost.encode())
            else:
                marker = (LEFT, b"") if failure is None else (FAILED, failure.encode())
            self._done[local] = marker
            for seq, rnd in self._rounds.items():
                if rnd.items[local] is None:
                    rnd.items[local] = marker
            ready = [(s, r) for s, r in self._rounds.items() if s == self._next and all(i is not None for i in r.items)]
            last = len(self._done) == self.k and not self._rounds
            if ready:
                self._next += 1
                ready[0][1].running = True
            elif last:
                self._next += 1
        for seq, rnd in ready:      # the round the other ranks of the process were waiting in
            limit = time.monotonic() + self.wait_timeout_s if self.wait_timeout_s else None
            self._run(seq, rnd, limit, "finish")
        if last and not ready:
            room = max(0, (SLOT_BYTES - 8) // self.k - _LEN.size)
            self.hub.ctl_post(_pack([(kind, body[:room]) for kind, body in
                                     (self._done[j] for j in range(self.k))]))


class RankControl(ControlPlane):
    """MpiControl as one rank's control plane (the interface PeerGroup calls)."""

    def __init__(self, control: MpiControl, rank: int):
        self._c, self.rank, self.local = control, rank, rank - control.base
        self.max_payload = control.max_payload
        if control.k == 1:              # a lone rank: its rounds are the process's (one call less per op)
            self.allgather, self.allgather_records = control._alone, control._alone_records

    def allgather(self, seq: int, payload: bytes, deadline, op=None) -> list:
        return self._c.allgather(self.local, seq, payload, deadline, op)

    def abort(self, code: str, reason: str) -> None:
        """A rank failed: every wait of the job fails (this process's now, the others' on the
        hub's ABORT frame)."""
        self._c.hub.abort(code, reason)

    def abort_for_communicator(self, code: str, reason: str) -> None:
        """comm.abort() on the world communicator: its control rounds fail on every process (its
        data waits by the transport's scoped abort); sub-communicators go on."""
        self._c.hub.abort_control(code, reason)

    def leave(self) -> None:
        pass                        # MpiGroup.exit / fail call MpiControl.finish with the reason


class HostBlockControl(ShmControl):
    """The world communicator's control plane of an MPI job of one node whose processes each host
    one rank: the job's shared-memory ControlBlock, as Ray's and torchrun's ranks of one host meet
    (`host_block` makes it). A waiting rank sleeps on the block's futex once it has yielded a
    while, where polling an MPI allgather keeps it on the run queue: with 8 processes on 2 cores
    an 8-byte op took about half the time. A rank's failure also ends the waits of the job's MPI
    traffic (the hub's abort, told to every process), as RankControl's does."""

    def __init__(self, block, hub):
        super().__init__(block)
        self.hub = hub

    def abort(self, code: str, reason: str) -> None:
        super().abort(code, reason)
        self.hub.abort(code, reason)


def host_block(comm, ranks: int):
    """(this process's handle on the job's control block as rank comm.Get_rank(), the handle of
    the process that created it or None), or (None, None) where a process could not make or attach
    it (every process gets the same answer). Collective over `comm`, every process on one node:
    process 0 creates the block (its session names it, so shm.sweep_orphans removes it if process
    0 dies), tells the others its name, and every process attaches before any may close it."""
    from mpi4py import MPI
    name, owner = bytearray(128), None
    if comm.Get_rank() == 0:
        shm.sweep_orphans()          # blocks of jobs whose process 0 was killed on this host
        try:
            owner = ControlBlock.create(shm.new_session(), ranks, PAYLOAD_BYTES)      # as Ray's job block
            name[:len(owner.session)] = owner.session.encode()
        except (HcclError, OSError):
            owner = None
    block, every = None, bytearray(1)
    try:
        comm.Bcast([name, MPI.BYTE], root=0)
        session = bytes(name).rstrip(b"\0").decode()
        if session:
            try:
                block = ControlBlock.attach(session, comm.Get_rank())
            except (HcclError, OSError):
                block = None
        comm.Allreduce([bytearray([block is not None]), MPI.UNSIGNED_CHAR], [every, MPI.UNSIGNED_CHAR], op=MPI.MIN)
    finally:
        if not every[0]:
            for handle in (block, owner):
                if handle is not None:
                    handle.close()
    return (block, owner) if every[0] else (None, None)
