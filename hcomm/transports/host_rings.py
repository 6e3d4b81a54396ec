"""Same-host records in shared memory: how the socket transport's ranks of one host reach each other.

Ranks of one host that keep their buffers in shared memory (hcomm.memory.segment_provider) send
each other only a slice's place and get back an acknowledgement: records of a few hundred bytes.
Over TCP each costs a frame through the kernel, a reader thread's wake-up and its hand-off to the
rank's thread; here a record goes into a ring in the receiver's segment, and the receiver's own
thread, asleep on its doorbell (a futex), wakes and reads it: one wake-up, no thread between.

Each rank owns one segment (`HostRings(name_of, me, host_ranks)`, named under its rank's prefix so
that cleaning its session or its crashed rank removes it): its doorbell word and one ring per
rank of its host that may send to it (single producer, single consumer: the producer writes a
slot, then advances the ring's head; the consumer reads up to the head, then advances the tail).
A producer rings the doorbell after every record: it writes a value of its own there (its index
and a count, so never the value a sleeper read before) and, if the consumer has a thread asleep
(its sleepers word), wakes the futex. A consumer reads the doorbell, then the rings, and sleeps
only while the doorbell still holds what it read: the kernel compares the word under the lock the
wake takes, so no record goes unseen. Whatever reaches a rank by another path (a TCP frame, an
abort, a peer lost) rings its doorbell too (`ring_self`).

Step words. Ranks that run a schedule's steps over each other's buffers in place (hcomm.exec.hosted)
need no record per slice: each publishes, in a line of its own segment that only it writes, how far
it is (the step whose sends it exposes, the step whose receives it has finished) and where its
buffers lie for the op (its places, stamped with the op); peers read those words through their
mapping of its segment, and the publisher rings the doorbells of the peers that wait on it.

Ordering (hcomm.memory.ordered, so that weakly ordered machines such as aarch64 run it as
store-ordered (TSO) ones do): a word that says data is there is stored with release after the data and loaded with
acquire before it: a ring's head after its slot, its tail after the slot was read (the producer
reuses it), a step word after the slices it exposes or read, the places stamp after the record,
the segment's magic after its header. The doorbell is stored after the head (release) and loaded
with acquire before the rings are read, so a consumer that read an old bell reads at least the
heads that bell stood for. Waking is a store against a later load on each side: a producer's
doorbell store is `store_fenced`, so its look at the sleepers word that follows cannot pass it, and
a consumer's sleepers store is parted from its futex compare by the kernel's full barrier in the
futex wait; so a producer that finds no sleeper stored its doorbell before the sleeper's compare.
"""
from __future__ import annotations

import os
import struct
import threading

from ..memory.ordered import Words
from ..memory.shared_file import Futex, Mapping, proc_start_time

MAGIC = 0x68636f6d72696e67          # "hcomring"
SLOTS = 64                           # records in flight per ordered pair (a step posts a few)
SLOT_BYTES = 512                     # a record at most, with its length; longer ones go by TCP
_HEADER = 192                        # magic, producers; the doorbell on a line of its own; the step words
_BELL = 64                           # a 4-byte futex word, the low half of word 8 (bytes 68-71 unused)
_BELL_W = _BELL >> 3
_SLEEPERS_W = 9                      # word index (byte 72): the consumer's threads asleep on the doorbell
_ACK_SLEEPERS_W = 10                 # (byte 80): those of them waiting for an acknowledgement
POSTED_W, TAKEN_W = 16, 17           # (bytes 128, 136) the owner's step words: sends exposed, receives done
_PLACES_W, _PLACES_LEN_W = 18, 19    # (bytes 144, 152) the stamp of its places record, the record's length
EXITED_W = 20                        # (byte 160) set once the owner sends and reads nothing more
_PID_W, _START_W = 21, 22            # (bytes 168, 176) the owner's process and its start time
_PIDNS_W = 23                        # (byte 184) its pid namespace: only a peer in the same one can look it up
PLACES_BYTES = 2048                  # the places record at most (after the rings)
_RING_HEAD = 128                     # head and tail words, a cache line each
_LEN = struct.Struct("<I")
_RING = _RING_HEAD + SLOTS * SLOT_BYTES


def _pid_namespace() -> int:
    """This process's pid namespace (its inode), 0 if unknown."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


class _Ring:
    """This rank's end of one ring: the producer's view of a peer's segment, or the consumer's own."""
    __slots__ = ("mapping", "q", "w", "base", "head", "tail", "futex", "lock")

    def __init__(self, mapping, index):
        self.mapping = mapping
        self.q = mapping.buf.cast("q")        # plain loads: polls, and words only this rank writes
        self.w = Words(mapping.buf)           # ordered ones (module docstring: Ordering)
        self.base = _HEADER + index * _RING
        self.head, self.tail = self.base >> 3, (self.base + 64) >> 3
        self.futex = Futex(self.w.base + _BELL)
        self.lock = threading.Lock()

    def close(self):
        self.q.release()
        self.mapping.close()


class HostRings:
    """One rank's rings: `name_of(rank)` is the segment name of a rank of this host (peers attach
    to theirs on their first record), `host_ranks` every rank of the host, this one (`me`) among
    them."""

    def __init__(self, name_of, me: int, host_ranks):
        self.name_of, self.me = name_of, me
        self.ranks = tuple(sorted(host_ranks))
        self.index = {r: i for i, r in enumerate(self.ranks)}
        self._count = 0
        self._places_at = _HEADER + len(self.ranks) * _RING
        self._own = Mapping(name_of(me), self._places_at + PLACES_BYTES, _HEADER)
        self._own_q = self._own.buf.cast("q")
        self._own_q[_PID_W], self._own_q[_START_W] = os.getpid(), proc_start_time(os.getpid()) or 0
        self._own_q[_PIDNS_W] = self._pidns = _pid_namespace()
        self._own_q[1] = len(self.ranks)
        self._own_w = Words(self._own.buf)
        self._own_w.store(0, MAGIC)           # release: the header before it
        self._rings = [_Ring(self._own, i) for i in range(len(self.ranks))]   # the consumer's: one per producer
        self._tails = [0] * len(self.ranks)
        self._me_ring = self._rings[self.index[me]]
        self._out = {}                       # peer -> _Ring in its segment (this rank's, as producer)
        self._out_lock = threading.Lock()
        self._closed = False

    # ---- producing -----------------------------------------------------------------------------
    def send(self, dst: int, record: bytes, ack: bool = False) -> bool:
        """Put `record` in `dst`'s ring from this rank and ring its doorbell; False, at once, if it
        is too long for a slot, the ring is full or `dst` has not made its segment yet: the caller
        sends it another way (never waiting here, so two ranks that fill each other's rings
        before either reads cannot deadlock). An acknowledgement (`ack`) wakes only a thread that
        waits for one: a rank waiting for data would only go back to sleep."""
        n = len(record)
        if n + _LEN.size > SLOT_BYTES:
            return False
        ring = self._out.get(dst) or self._attach(dst)
        if ring is None:
            return False
        q = ring.q
        with ring.lock:
            h = q[ring.head]
            if h - ring.w.load(ring.tail) >= SLOTS:       # acquire: the consumer read the slot it freed
                return False
            at = ring.base + _RING_HEAD + (h % SLOTS) * SLOT_BYTES
            buf = ring.mapping.buf
            _LEN.pack_into(buf, at, n)
            buf[at + _LEN.size:at + _LEN.size + n] = record
            ring.w.store(ring.head, h + 1)                # release: the slot before it
            self._ring(ring)
        if q[_ACK_SLEEPERS_W if ack else _SLEEPERS_W]:      # after the lock's release: the module docstring
            ring.futex.wake()
        return True

    def _ring(self, ring) -> None:
        """Store a new doorbell value: after what it announces, before the look at the sleepers."""
        self._count += 1
        ring.w.store_fenced(_BELL_W, ((self._count & 0x3FFFFFF) << 6 | self.index[self.me] & 0x3F) & 0xFFFFFFFF)

    def _attach(self, dst):
        """This rank's ring in `dst`'s segment, mapped once; None while `dst` has not made it."""
        with self._out_lock:
            ring = self._out.get(dst)
            if ring is not None or self._closed:
                return ring
            try:
                mapping = Mapping(self.name_of(dst), header_bytes=_HEADER)
            except FileNotFoundError:
                return None
            ready = Words(mapping.buf).load(0) == MAGIC     # acquire: the header written before it
            if not ready:
                mapping.close()
                return None
            ring = self._out[dst] = _Ring(mapping, self.index[self.me])
        return ring

    def ring(self, dst: int, ack: bool = False) -> None:
        """Ring `dst`'s doorbell (a step word of this rank changed), waking its sleepers as `send`
        does (`ack`: only those waiting for an acknowledgement)."""
        ring = self._out.get(dst) or self._attach(dst)
        if ring is None:
            return
        with ring.lock:
            self._ring(ring)
        if ring.q[_ACK_SLEEPERS_W if ack else _SLEEPERS_W]:   # after the lock's release: the module docstring
            ring.futex.wake()

    # ---- step words (hcomm.exec.hosted) ------------------------------------------------------------
    def publish(self, word: int, value: int) -> None:
        """Set this rank's step word (POSTED_W, TAKEN_W) to `value`: a release store, after the
        slices it exposes or has read."""
        self._own_w.store(word, value)

    def word_of(self, peer: int, word: int) -> int:
        """`peer`'s step word as it is now (0 while its segment is not there): an acquire load, so
        what `peer` did before storing it is visible."""
        ring = self._out.get(peer) or self._attach(peer)
        return 0 if ring is None else ring.w.load(word)

    def gone(self, peer: int):
        """Why `peer`'s process is known to be gone (its segment names a process that is not
        running), else None. Never waits."""
        ring = self._out.get(peer)
        if ring is None:
            return None
        pid, start = ring.q[_PID_W], ring.q[_START_W]
        if start and ring.q[_PIDNS_W] == self._pidns and proc_start_time(pid) != start:
            return f"its process {pid} is gone"
        return None

    def write_places(self, stamp: int, record: bytes) -> bool:
        """Publish this rank's places record under `stamp` (record first, stamp last); False if it
        is too long."""
        n = len(record)
        if n > PLACES_BYTES:
            return False
        q, at = self._own_q, self._places_at
        self._own.buf[at:at + n] = record
        q[_PLACES_LEN_W] = n
        self._own_w.store(_PLACES_W, stamp)           # release: the record and its length before it
        return True

    def places_stamp(self, peer: int) -> int:
        return self.word_of(peer, _PLACES_W)

    def places_of(self, peer: int) -> bytes:
        """`peer`'s places record (read once its stamp is the one awaited: it does not change
        while this rank still reads the op's slices, hcomm.exec.hosted)."""
        ring = self._out.get(peer) or self._attach(peer)
        n, at = ring.q[_PLACES_LEN_W], self._places_at
        return bytes(ring.mapping.buf[at:at + n])

    def ring_self(self) -> None:
        """Wake this rank's own sleepers (something reached it another way). Called with the lock
        that guards `asleep` held, so it sees every thread that is going to sleep."""
        ring = self._me_ring
        if not self._closed and ring.q[_SLEEPERS_W]:
            self._ring(ring)
            ring.futex.wake()

    # ---- consuming -----------------------------------------------------------------------------
    def bell(self) -> int:
        """The doorbell as it is now: read (acquire) before `drain`, handed to `sleep`."""
        return self._me_ring.w.load(_BELL_W) & 0xFFFFFFFF

    def drain(self) -> list:
        """Every record sent to this rank since the last drain, as (src, record), in each sender's
        order. One thread at a time (the transport's lock held)."""
        got = []
        buf, tails = self._own.buf, self._tails
        for i, ring in enumerate(self._rings):
            q = ring.q
            t = tails[i]
            if q[ring.head] == t:                 # a plain poll; the acquire load once it moved
                continue
            h = ring.w.load(ring.head)
            src = self.ranks[i]
            while t < h:
                at = ring.base + _RING_HEAD + (t % SLOTS) * SLOT_BYTES
                n, = _LEN.unpack_from(buf, at)
                got.append((src, bytes(buf[at + _LEN.size:at + _LEN.size + n])))
                t += 1
            tails[i] = t
            ring.w.store(ring.tail, t)            # release: the slots read before the producer reuses them
        return got

    def sleepers(self) -> int:
        """How many threads of this rank are asleep on its doorbell (counted as they go to sleep)."""
        return self._me_ring.q[_SLEEPERS_W]

    def asleep(self, delta: int, for_acks: bool = False) -> None:
        """A thread of this rank is going to sleep (+1) or woke (-1), waiting for an
        acknowledgement or not: under the caller's lock, released between the two (the fence the
        module docstring names)."""
        q = self._me_ring.q
        q[_SLEEPERS_W] += delta
        if for_acks:
            q[_ACK_SLEEPERS_W] += delta

    def sleep(self, bell: int, timeout_s: float) -> None:
        """Sleep up to timeout_s unless the doorbell changed since it read `bell`."""
        self._me_ring.futex.wait(bell, timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ring in self._out.values():
            ring.close()
        self._out.clear()
        for ring in self._rings:
            ring.q.release()
        self._own_q.release()
        self._own.close()
        try:
            os.unlink(self._own.path)
        except FileNotFoundError:
            pass

