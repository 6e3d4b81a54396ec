"""The socket transport's path to the peers on its own host: places and acknowledgements as records in
shared-memory rings (hcomm.transports.host_rings), read by the waiting rank's own thread.

`SameHost` is what SocketTransport.share_host switches on. A data frame to a peer of this host
whose slice lies in this rank's segments is a record of its place (the peer maps the segment and
reads the slice where it lies, as HCCL's zero-copy peers do); the acknowledgement comes back as a
record too. Everything else (slices elsewhere, control payloads, abort notices, goodbyes, and all
traffic with other hosts) stays on TCP, so a rank's waits are woken by both: the transport's
condition rings the rank's doorbell on every change (`BellCondition`), and a waiting rank sleeps on
the doorbell, reading its rings each time it wakes.

Frames to one peer thus take two paths, and messages of one (source, tag) must still be taken in
the order they were sent: every data frame to a peer of this host carries the pair's running
number, and the receiver holds back one that overtook an earlier one (`PairOrder`).
"""
from __future__ import annotations

import pickle
import threading

from .host_rings import HostRings
from .host_steps import HostSteps
from .peer import RemoteMessage, dtype_from_wire, wire_dtype

_DATA, _ACK = 0, 1
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class BellCondition(threading.Condition):
    """A transport's condition whose every notify also rings its rank's doorbell (`bell`, set once
    the rank's rings exist), so that a rank asleep on the doorbell hears what a socket thread
    delivered."""

    def __init__(self, lock):
        super().__init__(lock)
        self.bell = None

    def notify_all(self):
        super().notify_all()
        if self.bell is not None:
            self.bell()

    notifyAll = notify_all


class PairOrder:
    """Running numbers of the data frames between this rank and each peer of its host: `next(dst)`
    numbers a frame to send; `arrive(src, n, msg, enqueue)` hands `msg` on in its sender's order
    (lock held)."""

    def __init__(self):
        self._next, self._lock = {}, threading.Lock()
        self._expect, self._held = {}, {}

    def next(self, dst) -> int:
        with self._lock:
            n = self._next.get(dst, 0)
            self._next[dst] = n + 1
        return n

    def arrive(self, src, n, msg, enqueue) -> None:
        want = self._expect.get(src, 0)
        if n != want:
            self._held.setdefault(src, {})[n] = msg
            return
        enqueue(msg)
        want += 1
        held = self._held.get(src)
        while held and want in held:
            enqueue(held.pop(want))
            want += 1
        self._expect[src] = want


class SameHost:
    """Transport `tr`'s rings to the ranks `host_ranks` of its host (itself among them); its buffers
    in `memory` (a SegmentProvider); `name_of(rank)` names a rank's ring segment."""

    def __init__(self, tr, memory, host_ranks, name_of):
        self.tr, self.memory = tr, memory
        self.rings = HostRings(name_of, tr.rank, host_ranks)
        self.steps = HostSteps(self.rings, memory, set(host_ranks) - {tr.rank})

    def send_place(self, handle, view, meta, place, n) -> bool:
        """The record of a slice's place to `handle.dst`; False if it could not go by the rings (too
        long, the ring full, the peer's rings not made yet): the frame then goes by TCP, numbered."""
        record = pickle.dumps((_DATA, n, handle.id, handle.tag, wire_dtype(view.dtype), view.shape, place[0], place[1], meta),
                              protocol=_PROTOCOL)
        return self.rings.send(handle.dst, record)

    def send_ack(self, src, msg_id, reply) -> bool:
        return self.rings.send(src, pickle.dumps((_ACK, msg_id, reply), protocol=_PROTOCOL), ack=True)

    def drain(self) -> int:
        """Take in every record sent to this rank (the transport's lock held): places become
        messages in their senders' order, acknowledgements complete sends."""
        tr = self.tr
        got = self.rings.drain()
        for src, raw in got:
            rec = pickle.loads(raw)
            if rec[0] == _DATA:
                _, n, msg_id, tag, dtype, shape, seg, off, meta = rec
                data = self.memory.peer_view(seg, off, shape, dtype_from_wire(dtype))
                tr.arrivals.arrive(src, n, RemoteMessage(tr, src, tag, data, meta, msg_id), tr.enqueue_locked)
            else:
                tr.complete_locked(rec[1], rec[2])
        return len(got)

    def idle(self, timeout: float, for_acks: bool = False, ready=None) -> None:
        """A wait of the transport (its lock held): read the rings; with nothing there (and, for a
        wait on peers' step words, `ready()` still false), sleep on the doorbell (the lock released
        meanwhile) until something arrives by either path; a wait for data sleeps on through
        acknowledgements (`for_acks`: HostRings.asleep)."""
        bell = self.rings.bell()
        if self.drain() or (ready is not None and ready()):
            return
        cond, rings = self.tr.cond, self.rings
        rings.asleep(1, for_acks)
        cond.release()
        try:
            rings.sleep(bell, timeout)
        finally:
            cond.acquire()
            rings.asleep(-1, for_acks)

    def close(self) -> None:
        self.steps.close()
        self.rings.close()
