"""The MPI process hub under hcomm.transports.mpi: ranks are MPI processes (or threads of them),
payloads move with mpi4py's buffer calls (upper-case Isend/Irecv on numpy buffers; nothing is
pickled). This module holds what a process does for all its ranks (frames, progress, abort, the
control allgather, closing); the per-rank endpoint is hcomm.transports.mpi.endpoint.MpiTransport.

One `MpiHub` per process and job owns a duplicate of the job's communicator (so nothing else the
program sends can match ours), and serves the `MpiTransport` endpoints of the ranks the process
hosts (rank r lives on process r // ranks_per_process). Every MPI call of the process goes
through the hub's lock, one at a time: MPI_THREAD_SERIALIZED is all a process of several rank
threads needs (`require_thread_level`), and a lone rank needs nothing more than a plain MPI.

A message is a frame (tag FRAME: kind, source and destination rank, message id, payload size,
a JSON header with tag, dtype, shape, meta) and, for payloads over INLINE_BYTES, the payload
itself as a second message (tag PAYLOAD) sent straight from the slice's memory and received
straight into a numpy array of its shape. Both leave under the lock, so a process's payloads
reach a peer process in the order of their frames, and an Irecv posted on each frame matches its
own payload (MPI's non-overtaking rule). Frames from one process are delivered in the order they
were sent (a small message never overtakes a large one still arriving).

Nobody runs a progress thread: a rank that waits (PeerEndpoint's `_idle`) drives the hub, which
receives what has arrived for any of the process's ranks, completes sends and hands the messages
to their endpoints; while nothing moves it polls flat out for 50 us (a peer on another core
answers within that; not at all on a node running more of the job's processes than it has
cores), then yields the CPU between polls (MPI moves a collective only while its processes poll,
so 8 processes on 2 cores need each other's turns), and past 5 ms sleeps, at most 1 ms at a time.
Every wait keeps its deadline (HCCL_EXEC_TIMEOUT) and ends at once on abort: `hub.abort` fails
every local wait and tells every other process (an ABORT frame), whose hub fails theirs. A rank the fault plan crashes (`hub.lose`)
stops taking part while its process lives on: a LOST frame makes every endpoint of the job take
it for lost, as a dead peer's closed connection does on the socket transport.

The world communicator's control allgather (`ctl_allgather`, on a second duplicate) and the
waits' polling policy are hcomm.transports.mpi.hub_allgather, which the hub inherits. A process that gave up on a
round (aborted) or called fewer than its peers (returned early) evens the count at `close`: the
processes exchange how many they posted and how many frames each sent every other, post the
missing rounds, and receive until every frame sent to them is in, so no request is left pending.
"""
from __future__ import annotations

import json
import struct
import threading
import time

import numpy as np

from topologies.errors import Cause, HcclError

from .hub_allgather import SLOT_BYTES, ControlRounds, _BUSY_S, _POLL_S, _oversubscribed, _pause, _tightened
from ..peer import json_plain as _plain, json_tuples as _tuples

FRAME, PAYLOAD = 11, 12             # MPI tags on the hub's communicator
DATA, ACK, BYE, ABORT, CTL_ABORT, LOST = 1, 2, 3, 4, 5, 6
_HEAD = struct.Struct("<BiiqQI")    # kind, src rank, dst rank, message id, payload bytes, header bytes
INLINE_BYTES = 16 << 10             # payloads up to this travel inside their frame (one message, one copy)
_POOL_PER_SHAPE = 4


def _mpi():
    from mpi4py import MPI
    return MPI


def require_thread_level(ranks_per_process: int) -> None:
    """E_NOT_SUPPORT unless MPI was initialised with the thread support `ranks_per_process`
    threads need (THREAD_SERIALIZED: the hub serialises every MPI call of the process)."""
    MPI = _mpi()
    if ranks_per_process > 1 and MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        names = {MPI.THREAD_SINGLE: "THREAD_SINGLE", MPI.THREAD_FUNNELED: "THREAD_FUNNELED"}
        raise HcclError("E_NOT_SUPPORT", f"ranks_per_process={ranks_per_process} runs ranks as threads that call MPI, "
                        f"which needs MPI_THREAD_SERIALIZED or more; this MPI was initialised with "
                        f"{names.get(MPI.Query_thread(), MPI.Query_thread())} (mpi4py.rc.thread_level)")


def _bytes_of(arr: np.ndarray) -> np.ndarray:
    return arr.reshape(-1).view(np.uint8)


class MpiHub(ControlRounds):
    """One process's MPI traffic for one job: the endpoints of its ranks, its pending requests."""

    def __init__(self, comm, size: int, ranks_per_process: int, timeout_s=None):
        MPI = self.MPI = _mpi()
        self.k = int(ranks_per_process)
        self.nprocs, self.proc = comm.Get_size(), comm.Get_rank()
        if size != self.nprocs * self.k:
            raise HcclError("E_PARA", f"{size} ranks do not fit {self.nprocs} MPI processes x {self.k} ranks per process")
        self.size, self.timeout_s = size, timeout_s
        self.comm, self.ctl = comm.Dup(), comm.Dup()
        self.busy_s = 0.0 if _oversubscribed(comm) else _BUSY_S   # how long a wait spins before it yields
        self._spin_polls = int(self.busy_s / _POLL_S)
        self._sizes = struct.Struct("<" + f"q{SLOT_BYTES - 8}x" * self.nprocs)   # a round's slot lengths
        self.lock = threading.Lock()
        self.endpoints = {}
        self._sends = []                       # (request, what must live until it completes)
        self._incoming = [[] for _ in range(self.nprocs)]   # per source process: [request|None, deliver args]
        self.sent_to = [0] * self.nprocs       # frames sent to each process
        self.received_from = [0] * self.nprocs
        self._ctl_posted, self._ctl_pending = 0, []
        self._ring = self._new_ring()          # the control rounds' buffers (hub_allgather._Slots), in turn
        self._layouts = {}                     # (head, record format) -> struct of a records round's slots
        self._pool = {}
        self._idle_since = time.monotonic()     # when the last poll of a waiting rank moved something
        self.aborted = self.ctl_aborted = None
        self.on_abort = []                     # callbacks(code, reason): the control plane's waiters
        self.closed = False

    @property
    def rounds_posted(self) -> int:
        """Control rounds this process has posted so far (an abort names how many its sender had)."""
        return self._ctl_posted

    def local_ranks(self):
        return range(self.proc * self.k, (self.proc + 1) * self.k)

    # sending ----------------------------------------------------------------------------------------
    def send(self, kind, src, dst, msg_id, header, payload=None) -> None:
        try:
            head = json.dumps(header, default=_plain, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise HcclError("E_PARA", f"the MPI transport sends tags and meta as JSON: {exc}", rank=src) from None
        n = 0 if payload is None else payload.nbytes
        inline = n <= INLINE_BYTES
        frame = np.empty(_HEAD.size + len(head) + (n if inline else 0), dtype=np.uint8)
        _HEAD.pack_into(frame, 0, kind, src, dst, msg_id, n, len(head))
        frame[_HEAD.size:_HEAD.size + len(head)] = np.frombuffer(head, dtype=np.uint8)
        if inline and n:
            frame[_HEAD.size + len(head):] = _bytes_of(payload)
        proc, B = (dst // self.k if dst >= 0 else -dst - 1), self.MPI.BYTE
        with self.lock:
            if self.closed:
                raise HcclError("E_IN_STATUS", "the MPI transport of this job is closed", rank=src)
            self._sends.append((self.comm.Isend([frame, B], proc, FRAME), frame))
            if not inline:
                self._sends.append((self.comm.Isend([_bytes_of(payload), B], proc, PAYLOAD), payload))
            self.sent_to[proc] += 1

    def abort_control(self, code: str, reason: str, tell_peers: bool = True, rounds=None) -> None:
        """Fail every control round, here and (with `tell_peers`) in every other process: the
        world communicator's comm.abort(); its data waits are the endpoints' scoped abort.
        `rounds`: an abort heard from a process that had posted that many control rounds (the
        rounds it posted can still complete, and do: see abort_stops); None: a local abort."""
        self.ctl_aborted = _tightened(self.ctl_aborted, code, reason, rounds)
        for cb in list(self.on_abort):
            cb(code, reason, rounds)
        if tell_peers:
            self._tell_peers(CTL_ABORT, -1, {"code": code, "reason": reason, "rounds": self._ctl_posted})

    def abort(self, code: str, reason: str, tell_peers: bool = True, rounds=None) -> None:
        """Fail every wait of this process's ranks; with `tell_peers`, every other process's too
        (`rounds` as for abort_control: control rounds the aborting process posted still complete)."""
        self.aborted = _tightened(self.aborted, code, reason, rounds)
        for ep in list(self.endpoints.values()):
            ep.abort(code, reason)
        for cb in list(self.on_abort):
            cb(code, reason, rounds)
        if tell_peers:
            self._tell_peers(ABORT, -1, {"code": code, "reason": reason, "rounds": self._ctl_posted})

    def lose(self, rank: int, reason: str) -> None:
        """Rank `rank` of this process stops taking part (a fault plan's rank_crash; its process
        lives on, as MPI needs): its endpoint goes, so what reaches it is received and dropped,
        never acknowledged, and every endpoint of the job, here and in every other process (a LOST
        frame, behind everything the rank sent before), takes it for lost, as a dead peer's closed
        connection tells the others on the socket transport."""
        if rank not in self.local_ranks():
            raise HcclError("E_INTERNAL", f"rank {rank} is not hosted by MPI process {self.proc}")
        self.endpoints.pop(rank, None)
        self._lost(rank, reason)
        self._tell_peers(LOST, rank, {"reason": reason})

    def _tell_peers(self, kind, src: int, header: dict) -> None:
        """A frame of `kind` from `src` to every other process of the job (none once closed)."""
        if not self.closed:
            for q in range(self.nprocs):
                if q != self.proc:
                    self.send(kind, src, -q - 1, -1, header)

    def _lost(self, rank: int, reason: str) -> None:
        for ep in list(self.endpoints.values()):
            ep.peer_down(rank, reason)

    # progress ---------------------------------------------------------------------------------------
    def progress(self) -> bool:
        """Receive what has arrived, complete what was sent, deliver in order; True if anything
        moved. Never blocks: a thread finding another at it returns False."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            moved, delivered = self._receive(), []
            for q, queue in enumerate(self._incoming):
                while queue and (queue[0][0] is None or queue[0][0].Test()):
                    delivered.append(queue.pop(0)[1])
            if self._sends:
                before = len(self._sends)
                self._sends = [s for s in self._sends if not s[0].Test()]
                moved = moved or len(self._sends) < before
        finally:
            self.lock.release()
        for args in delivered:      # outside the lock: endpoints take their own locks
            self._dispatch(*args)
        return moved or bool(delivered)

    def _receive(self) -> bool:
        MPI, got = self.MPI, False
        status = MPI.Status()
        while True:
            msg = self.comm.Improbe(MPI.ANY_SOURCE, FRAME, status)
            if msg is None:
                return got
            got = True
            q = status.Get_source()
            frame = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            msg.Recv([frame, MPI.BYTE])
            self.received_from[q] += 1
            kind, src, dst, msg_id, n, hlen = _HEAD.unpack_from(frame)
            header = json.loads(frame[_HEAD.size:_HEAD.size + hlen].tobytes())
            request, data = None, None
            if kind == DATA:
                data = self._buffer(tuple(header["shape"]), header["dtype"])
                if n <= INLINE_BYTES:
                    _bytes_of(data)[:] = frame[_HEAD.size + hlen:]
                else:
                    request = self.comm.Irecv([_bytes_of(data), MPI.BYTE], q, PAYLOAD)
            self._incoming[q].append([request, (kind, src, dst, msg_id, header, data)])

    def _dispatch(self, kind, src, dst, msg_id, header, data) -> None:
        if kind in (ABORT, CTL_ABORT):
            (self.abort if kind == ABORT else self.abort_control)(header["code"], header["reason"], tell_peers=False,
                                                                  rounds=header.get("rounds"))
            return
        if kind == LOST:
            self._lost(src, header["reason"])
            return
        ep = self.endpoints.get(dst)
        if ep is None:
            return                   # a rank of this process whose endpoint is closed: nothing waits
        if kind == DATA:
            ep.deliver(src, _tuples(header["tag"]), data, header.get("meta"), msg_id)
        elif kind == ACK:
            ep.acknowledged(msg_id, header.get("reply"))
        elif kind == BYE:
            ep.peer_returned(src, data=True, acks=True)

    def idle(self, timeout: float) -> None:
        """One poll of a waiting rank: progress, else yield or sleep (longer as nothing moves)."""
        now = time.monotonic()
        if self.progress():
            self._idle_since = now
            return
        _pause(now - self._idle_since, timeout, self.busy_s)

    # receive buffers, reused: a fresh array for every message costs page faults on every byte ------
    def _buffer(self, shape, dtype):
        free = self._pool.get((shape, dtype))
        if free:
            return free.pop()
        return np.empty(shape, dtype=np.dtype(dtype))

    def release(self, data) -> None:
        if data is None or data.base is not None or data.nbytes <= INLINE_BYTES:
            return
        with self.lock:
            free = self._pool.setdefault((data.shape, data.dtype.str), [])
            if len(free) < _POOL_PER_SHAPE:
                free.append(data)

    # the end of the job -------------------------------------------------------------------------------
    def close(self, deadline, blob: bytes = b"") -> list:
        """Even out the control rounds, receive every frame sent to this process, complete every
        request, gather every process's `blob` (in process order, returned), free the
        communicators. E_TIMEOUT past `deadline` (the job is then broken)."""
        if self.closed:
            raise HcclError("E_IN_STATUS", "the MPI transport of this job is already closed")
        MPI = self.MPI
        mine = np.array([self._ctl_posted] + self.sent_to, dtype=np.int64)
        every = np.empty(mine.size * self.nprocs, dtype=np.int64)
        with self.lock:
            req = self.comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T])
        self.wait_closing(req, deadline, "the job's closing exchange")
        every = every.reshape(self.nprocs, -1)
        while self._ctl_posted < every[:, 0].max():     # rounds the others posted and this process did not
            self._post(bytes(8), None, deadline, "the job's closing rounds", closing=True)   # (length 0: unread)
        expect = list(every[:, 1 + self.proc])
        while True:
            self.progress()
            pending = self.rounds_pending()
            with self.lock:
                done = (not pending and not self._sends and self.received_from == expect
                        and not any(self._incoming))
            if done:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise HcclError("E_TIMEOUT", f"process {self.proc}: the job's last messages did not arrive within "
                                f"{self.timeout_s or 0:g} s (received {self.received_from}, expected {expect})",
                                cause=Cause.TIMEOUT)
            time.sleep(1e-4)
        self.closed = True
        self.endpoints.clear()
        self._free_ring()
        blobs = self._gather_closing(blob, deadline)
        self.comm.Free()
        self.ctl.Free()
        return blobs

    def _gather_closing(self, blob: bytes, deadline) -> list:
        MPI = self.MPI
        n = np.array([len(blob)], dtype=np.int64)
        sizes = np.empty(self.nprocs, dtype=np.int64)
        with self.lock:
            req = self.comm.Iallgather([n, MPI.INT64_T], [sizes, MPI.INT64_T])
        self.wait_closing(req, deadline, "the job's closing exchange")
        mine = np.frombuffer(blob, dtype=np.uint8) if blob else np.zeros(0, dtype=np.uint8)
        every = np.empty(int(sizes.sum()), dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        with self.lock:
            req = self.comm.Iallgatherv([mine, MPI.BYTE], [every, (sizes.tolist(), offsets.tolist()), MPI.BYTE])
        self.wait_closing(req, deadline, "the job's closing exchange")
        return [every[o:o + k].tobytes() for o, k in zip(offsets, sizes)]

    def wait_closing(self, req, deadline, what):
        """_wait without the abort check: a job closes whether or not it was aborted."""
        while True:
            with self.lock:
                if req.Test():
                    return
            self.progress()
            if deadline is not None and time.monotonic() >= deadline:
                raise HcclError("E_TIMEOUT", f"process {self.proc}: {what} did not complete within "
                                f"{self.timeout_s or 0:g} s: a process of the job is stuck or gone",
                                cause=Cause.TIMEOUT)
            time.sleep(1e-4)
