"""The control allgather of an MPI process hub (hcomm.transports.mpi.hub's MpiHub inherits it), and how its
waits poll.

The world communicator's control allgather (`ctl_allgather`) is MPI's own allgather of fixed-size
slots (SLOT_BYTES per process) on a duplicate of the job's communicator of its own: MPI-4's
persistent one (MPI_Allgather_init once, a Start per round: no schedule is built per round, which
cut a bare loop's round by a quarter on 8 processes), MPI_Iallgather where the library has none.
Longer payloads take extra slot rounds, which every process computes
from the first round alike. `ctl_allgather_records` unpacks a round of records of one layout (a
loop's repeated small op) straight from the round's buffer, every slot in one call. Each round is
polled against its deadline (HCCL_EXEC_TIMEOUT) in a tight Test loop: on a node running more of
the job's processes than this one has cores it yields the CPU after every failed Test (a flat-out
spin only holds up the processes it waits for), otherwise it spins `_BUSY_S` first; past `_SPIN_S`
it sleeps. Every `_TESTS_PER_PROGRESS` polls it looks for an abort and the deadline and drives the
hub's progress, so abort frames are heard. An abort heard from another process carries how many
rounds that process had posted: those rounds still complete here (it contributed to them), later
ones fail (`abort_stops`), so a peer that finished a collective and then aborted does not fail the
others' part of it. `ctl_post` posts a process's last round unasked (its ranks are all done).
"""
from __future__ import annotations

import os
import struct
import time

import numpy as np

from topologies.errors import Cause, HcclError

SLOT_BYTES = 1024                   # one process's share of a control allgather round
_I64 = struct.Struct("<q")
_BUSY_S = 5e-5                      # a wait polls flat out this long (a peer on another core answers in us;
                                    # longer spins starve the processes it waits for when cores are few),
_SPIN_S = 5e-3                      # then yields the CPU between polls until this long, then sleeps
_MAX_SLEEP_S = 1e-3
_POLL_S = 5e-7                      # about one poll of a wait (a Test under the hub's lock), measured
_TESTS_PER_PROGRESS = 32            # a control round's Test()s between two looks at the hub's frames


def _pause(idle_s: float, most_s: float, busy_s: float = _BUSY_S) -> None:
    """Between two polls of a wait that has seen nothing for `idle_s`: poll flat out for `busy_s`,
    then yield the CPU (MPI moves a collective only while its processes poll: a sleeping process
    stalls every round it is in, and 8 processes on 2 cores need each other's turns), then sleep,
    longer as the wait goes on."""
    if idle_s < busy_s:
        return
    if idle_s < _SPIN_S:
        os.sched_yield()
    else:
        time.sleep(min(most_s, _MAX_SLEEP_S, idle_s / 10))


def _oversubscribed(comm) -> bool:
    """Whether this node runs more of the job's processes than this process may use cores: then a
    wait yields the CPU from its first idle poll (a flat-out spin only holds up the processes it
    waits for: measured on 2 cores, a 4-process control round took 120 us spinning 50 us first
    against 77 us yielding at once). Collective (a split of `comm` by node)."""
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        here = node.Get_size()
    finally:
        node.Free()
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return here > cores


def _tightened(got, code, reason, rounds):
    """An abort state (code, reason, control rounds it spares or None for all) after one more
    abort: the first reason stays, the limit only tightens."""
    if got is None:
        return code, reason, rounds
    if got[2] is None or (rounds is not None and rounds >= got[2]):
        return got
    return got[0], got[1], rounds


def _label(what) -> str:
    """A wait's description: a string, or a function making it (only an error needs it)."""
    return what() if callable(what) else what


class ControlRounds:
    """The control rounds of an MpiHub: its `ctl` communicator, lock, abort state (`aborted`,
    `ctl_aborted`), `progress()`, `_ring` (_new_ring), `_layouts`, `_sizes`, `_spin_polls` and round
    counts are the hub's."""

    def abort_stops(self, index: int):
        """The abort (code, reason) that fails control round `index` (counted from 0 over the
        job), or None. A process that aborted after posting a round contributed to it, so the
        round completes for everyone else: a peer that finished its part of a collective and then
        aborted (comm.abort()) must not fail the others' part of that same collective."""
        for got in (self.aborted, self.ctl_aborted):
            if got is not None and (got[2] is None or index >= got[2]):
                return got
        return None

    def _wait(self, request, deadline, what: str, index=None):
        """Poll `request` until done, the deadline or an abort. Between polls: spin `busy_s`
        (none on an oversubscribed node), then yield the CPU, past _SPIN_S sleep; every
        _TESTS_PER_PROGRESS polls check for an abort and the deadline and drive the hub's progress,
        so abort frames are heard (a progress call on every poll costs more than the Test it waits
        on; a tight loop is what lets 8 processes on 2 cores keep up with MPICH's own waits).
        `index`: the control round waited on (an abort spares the rounds its process posted:
        abort_stops)."""
        test, lock = request.Test, self.lock
        spin = self._spin_polls
        sched_yield = os.sched_yield
        polls, start = 0, None
        while True:
            with lock:
                if test():
                    return
            polls += 1
            if polls % _TESTS_PER_PROGRESS == 0:
                if self.aborted is not None or self.ctl_aborted is not None:
                    got = self.abort_stops(index) if index is not None else (self.aborted or self.ctl_aborted)
                    if got is not None:
                        raise HcclError(got[0], f"aborted: {got[1]}", cause=Cause.ABORTED)
                now = time.monotonic()
                if start is None:
                    start = now
                if deadline is not None and now >= deadline:
                    raise HcclError("E_TIMEOUT", f"{_label(what)} did not complete within {self.timeout_s or 0:g} s "
                                    "(HCCL_EXEC_TIMEOUT)", cause=Cause.TIMEOUT)
                self.progress()
                if now - start >= _SPIN_S:
                    time.sleep(min(_MAX_SLEEP_S, (now - start) / 10))
                    polls = _TESTS_PER_PROGRESS - 1     # sleeping: the next poll looks again
            elif polls > spin:
                sched_yield()

    def _ctl_round(self, blob: bytes, deadline, what, length=None, view=False) -> bytes:
        """One allgather of SLOT_BYTES per process; every process's slot, concatenated (with
        `view`, the round's own buffer, good until the round after next). With `length`, the slot
        starts with it (int64) and `blob` follows (a first round)."""
        slots, index = self._post(blob, length, deadline, what)
        self._wait(slots.pending, deadline, what, index)   # raising: abandoned, still pending
        slots.pending = None
        return slots.recv if view else bytes(slots.recv)

    def _post(self, blob: bytes, length, deadline, what, closing=False):
        """Start the next round with `blob` in this process's slot (after `length`, an int64, if
        given): (its _Slots, its index). Rounds take the ring's slots in turn; slots whose last
        round was abandoned and is still running first see it complete (a persistent request
        starts again only once done), or, for an Iallgather, hand it to close() and take new
        buffers. `closing`: the job's close posts it (an abort does not end its waits)."""
        slots = self._ring[self._ctl_posted % len(self._ring)]
        if slots.pending is not None:
            if slots.persistent is None:
                with self.lock:
                    self._ctl_pending.append((slots.pending, slots.send, slots.recv))
                    slots.renew(self)
            else:
                (self.wait_closing if closing else self._wait)(slots.pending, deadline, what)
                slots.pending = None
        send = slots.send
        if length is None:
            send[:len(blob)] = blob      # the rest of the slot is never read (lengths go first)
        else:
            _I64.pack_into(send, 0, length)
            send[8:8 + len(blob)] = blob
        with self.lock:
            req = slots.persistent
            if req is None:
                req = self.ctl.Iallgather(*slots.args)
            else:
                req.Start()
            slots.pending = req
            index = self._ctl_posted
            self._ctl_posted = index + 1
        return slots, index

    def _new_ring(self) -> list:
        """The control rounds' slots: two sets, taken in turn (a round abandoned in one leaves the
        next round the other), each with MPI-4's persistent allgather where the library has it
        (collective: every process makes them at the same point)."""
        ring = [_Slots(self) for _ in range(2)]
        try:
            for slots in ring:
                slots.persistent = self.ctl.Allgather_init(*slots.args)
        except (NotImplementedError, self.MPI.Exception):
            for slots in ring:
                if slots.persistent is not None:
                    slots.persistent.Free()
                    slots.persistent = None
        return ring

    def _free_ring(self) -> None:
        """Free the persistent requests (every round has completed)."""
        for slots in self._ring:
            if slots.persistent is not None:
                slots.persistent.Free()
                slots.persistent = None

    def ctl_allgather_records(self, head: bytes, payload: bytes, layout, deadline, what="the control allgather"):
        """(columns, None) when every process's blob is `head` and then a record of `layout` (a
        struct.Struct in "<" order; ControlPlane.allgather_records), else (None, the list
        `ctl_allgather` returns). One unpack of the round's buffer in place reads every slot."""
        blob = head + payload
        n = len(blob)
        if n > SLOT_BYTES - 8:
            return None, self.ctl_allgather(blob, deadline, what)
        recv = self._ctl_round(blob, deadline, what, n, view=True)
        slot = self._layouts.get((head, layout.format))
        if slot is None:
            slot = self._layouts[head, layout.format] = struct.Struct(
                f"<q{len(head)}s{layout.format.lstrip('<')}{SLOT_BYTES - 8 - n}x")
        columns = tuple(zip(*slot.iter_unpack(recv)))
        if columns[0].count(n) == self.nprocs and columns[1].count(head) == self.nprocs:
            return columns[2:], None
        return None, self._gathered(bytes(recv), blob, deadline, what)

    def ctl_allgather(self, blob: bytes, deadline, what="the control allgather") -> list:
        """Every process's `blob`, in process order (fixed-size rounds of the allgather). A
        process that posted a `ctl_post` round in the same place (it has no ranks left to call)
        ends the exchange after the first round: its blob is whole, longer ones are cut (None).
        `what`: the round's description for errors (or a function making it)."""
        first = SLOT_BYTES - 8
        raw = self._ctl_round(blob[:first] if len(blob) > first else blob, deadline, what, len(blob))
        return self._gathered(raw, blob, deadline, what)

    def _gathered(self, raw: bytes, blob: bytes, deadline, what) -> list:
        """ctl_allgather's list from its first round `raw`, with the further rounds a longer blob
        of any process takes."""
        first, S = SLOT_BYTES - 8, SLOT_BYTES
        sizes = self._sizes.unpack_from(raw)         # every slot's int64 length, in one call
        starts = range(8, S * self.nprocs, S)
        if max(sizes) <= first and min(sizes) >= 0:  # the common case: one round
            return [raw[at:at + n] for at, n in zip(starts, sizes)]
        if min(sizes) < 0:           # a final process: nobody posts more rounds (it will not)
            return [raw[at:at - n - 1] if n < 0 else (raw[at:at + n] if n <= first else None)
                    for at, n in zip(starts, sizes)]
        top = max(sizes)
        parts = [[raw[at:at + min(n, first)]] for at, n in zip(starts, sizes)]
        for i in range(-(-(top - first) // S)):   # every process computes the same count from round one
            at = first + i * S
            raw = self._ctl_round(blob[at:at + S], deadline, what)
            for q, n in enumerate(sizes):
                if n > at:
                    parts[q].append(raw[q * S:q * S + min(S, n - at)])
        return [b"".join(p) for p in parts]

    def ctl_post(self, blob: bytes) -> None:
        """Post this process's last round without waiting for it: `blob` (at most SLOT_BYTES - 8
        bytes) tells whoever meets it that this process's ranks are done; close() completes it."""
        if len(blob) > SLOT_BYTES - 8:
            raise HcclError("E_INTERNAL", f"a final control round holds {SLOT_BYTES - 8} bytes, not {len(blob)}")
        try:
            self._post(blob, -len(blob) - 1, None if not self.timeout_s else time.monotonic() + self.timeout_s,
                       "the round before this process's last")
        except HcclError:
            pass        # a round abandoned before would not end (an abort): close() evens the count

    def rounds_pending(self) -> bool:
        """Whether a control round this process posted is still running (close() drives them)."""
        with self.lock:
            for slots in self._ring:
                if slots.pending is not None and slots.pending.Test():
                    slots.pending = None
            self._ctl_pending = [c for c in self._ctl_pending if not c[0].Test()]
            return bool(self._ctl_pending) or any(slots.pending is not None for slots in self._ring)


class _Slots:
    """One set of a control round's buffers: this process's slot, every process's slots, the
    allgather's buffer arguments (built once), its persistent request (None: each round an
    Iallgather) and the round running in it (None once complete)."""
    __slots__ = ("send", "recv", "args", "persistent", "pending")

    def __init__(self, hub):
        self.persistent = self.pending = None
        self.renew(hub)

    def renew(self, hub) -> None:
        self.send, self.recv = bytearray(SLOT_BYTES), bytearray(SLOT_BYTES * hub.nprocs)
        self.args = ([self.send, hub.MPI.BYTE], [self.recv, hub.MPI.BYTE])
