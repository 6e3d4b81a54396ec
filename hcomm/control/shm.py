"""Same-host control plane in one shared-memory segment: the rendezvous of a collective without a hub.

The ranks of a session (separate processes that know each other only by the session string) attach
one segment holding, per rank, a published sequence number and a slot of up to `slot_bytes`.
`allgather(seq, payload)` publishes this rank's bytes for collective #seq and returns every rank's;
it is the whole rendezvous of a collective (each rank publishes its call signature and entry clock,
or a tiny op's input, and then plans locally). `barrier(seq)` is an allgather of nothing.

Slots are double-buffered by the parity of seq: a rank may run one op ahead of the slowest, and it
publishes into a slot again (seq + 2) only after every rank has published seq + 1, i.e. has read seq.

Waiting: a few `os.sched_yield()` polls (for up to YIELD_S), then a futex wait on the "done" word
of seq's parity. Whichever rank first sees every rank arrived (the last to publish, or a poller)
writes seq + 1 there (the same value from every writer, so no atomics are needed) and, if a rank
announced that it sleeps, wakes them all with one syscall. Spinning without yielding starves peers
when 8-16 processes share 2 cores, and yielding for long does too once other work is running;
the futex keeps waiting ranks off the run queue. Waits end at their deadline (E_TIMEOUT naming
the ranks missing), on an abort any rank or the creator sets (the abort's code and reason), when
a missing rank closed its handle (E_PARA) or its process is gone (E_REMOTE). An abort or close
also changes the done words (a high bit), so no waiter sleeps through it; a dead process cannot,
so a blocked waiter polls its missing peers' liveness.

Ordering (hcomm.memory.ordered): a publisher writes its payload, then its sequence with a release
store. Waiters poll the sequences with plain loads; the first to see every rank arrived makes one
acquire load of each rank's sequence (so every payload is visible to it) and then stores the done
word, so a waiter that finds the done word set by then needs one acquire load of it alone: each
payload's release store reaches it through the completer's. Aborts, reasons and a rank's state are
published the same way (the word that says so last, released). So it runs on weakly ordered
machines (aarch64) as on TSO ones (amd64); machines without a known futex number get E_NOT_SUPPORT
(hcomm.memory.shared_file.check_machine). One handle per process, used by one thread at a time.

Use in an engine: the driver creates the block before it starts the ranks and closes it (which
unlinks it) at shutdown; shm.cleanup(session) removes it too, shm.sweep_orphans() once the driver
is dead; a process replacing a creator that died takes the block over with adopt(session). Each rank process attaches once, and per collective calls
`allgather(seq, pickle.dumps(signature, entry clock, ...), deadline)` with seq its communicator's
collective counter. A rank that fails calls abort(code, reason) before raising, so its peers raise
the same error instead of timing out; a rank that returns calls leave(); between runs the driver
calls reset(). Payloads above slot_bytes are refused (E_PARA): those go over the data plane.
"""
from __future__ import annotations

import ctypes
import os
import struct as _struct
import time

from topologies.errors import HCCL_RESULT, Cause, HcclError

from ..memory import segments as shm
from ..memory.ordered import Words as _Words
from ..memory.shared_file import FUTEX_WAIT as _FUTEX_WAIT, FUTEX_WAKE as _FUTEX_WAKE, SYS_FUTEX as _SYS_FUTEX
from ..memory.shared_file import check_machine as _check_machine
from ..memory.shared_file import L as _L, Mapping as _Mapping, Timespec as _Timespec, futex_call as _syscall
from ..memory.shared_file import proc_start_time as _proc_start_time


DEFAULT_SLOT_BYTES = 4096
MAGIC = 0x6863636c63746c31          # "hcclctl1"
SPINS = 2                            # sched_yield polls always made before blocking
YIELD_S = 0.001                      # and keeps polling so until a wait is this old (about three 8-rank
                                     # small ops on 2 cores), so a loop of ops with a little work between
                                     # stays off the futex; longer waits sleep. Measured on 2 cores, 8 Ray
                                     # ranks (experiments/small_op_profile.py): 8-byte AllReduce after a
                                     # barrier 367-371 us against 414-428 us at 0.2 ms; a rank's 1 ms of
                                     # numpy work while 7 peers yield-wait 0.99-1.03x its time while they
                                     # sleep (five runs)
BLOCK_SLICE_S = 0.05                 # longest single futex sleep: bounds a (theoretical) lost wake-up
LIVENESS_S = 0.1                     # how often a blocked waiter checks that missing peers' processes live
REASON_BYTES = 256

_HEADER = 64                         # magic, size, slot_bytes, abort flag
_WORDS = 128                         # a record's words, then its abort reason
_RECORD = _WORDS + REASON_BYTES      # per rank, and one for the creator
_W_MAGIC, _W_SIZE, _W_SLOT, _W_ABORT, _W_DONE = 0, 1, 2, 3, 4      # _W_DONE, _W_DONE + 1: by parity
_R_SEQ, _R_PID, _R_START, _R_STATE, _R_CODE, _R_ASEQ, _R_RLEN, _R_SLEEP = range(8)
_DETACHED, _ATTACHED, _CLOSED, _LEFT = 0, 1, 2, 3
_MASK = 0x3FFFFFFF                   # done word = (seq + 1) & _MASK; _BROKEN marks an abort or close
_BROKEN = 0x40000000
_CODE_NAMES = {v: k for k, v in HCCL_RESULT.items()}

def segment_name(session: str) -> str:
    """Under the session's prefix, so shm.cleanup(session) and shm.sweep_orphans remove it."""
    return f"{shm.PREFIX}{session}_control"


class ControlBlock:
    """A handle on a session's control segment: the creator's (rank None) or one rank's."""

    def __init__(self, seg, session: str, rank, owner: bool):
        self._seg, self.session, self.rank, self._owner = seg, session, rank, owner
        self._q = seg.buf.cast("q")
        self._w = _Words(seg.buf)          # the ordered accesses (module docstring: Ordering)
        magic = self._w.load(_W_MAGIC)     # acquire: the header written before it
        if magic != MAGIC:
            self._q.release()
            seg.close()
            if magic == 0:          # its creator has not finished writing the header
                raise HcclError("E_NOT_FOUND", f"the control block of session {session!r} is not ready yet", rank=rank)
            raise HcclError("E_INTERNAL", f"segment {seg.name} is not a control block", rank=rank)
        self.size, self.slot_bytes = int(self._q[_W_SIZE]), int(self._q[_W_SLOT])
        self._stride = (8 + self.slot_bytes + 63) // 64 * 64
        self._slots = _HEADER + (self.size + 1) * _RECORD
        self._base = self._w.base                 # the mapping's address, for futex calls
        self._map = seg.map
        self._ts = _Timespec()
        self._seq_at = [self._rec(j) + _R_SEQ for j in range(self.size)]
        # every rank's slot (its length word, then its bytes) of each parity
        self._slot_at = [[self._slots + (j * 2 + parity) * self._stride for j in range(self.size)] for parity in (0, 1)]
        # every rank's _R_SLEEP word (the seq + 1 it sleeps for, 0 when awake) as one strided view
        self._sleepers = self._q[self._rec(0) + _R_SLEEP:self._rec(self.size):_RECORD >> 3]
        self._wake_args = [(_L(_SYS_FUTEX), _L(self._base + (_W_DONE + i) * 8), _L(_FUTEX_WAKE), _L(0x7FFFFFFF),
                            None, None, _L(0)) for i in (0, 1)]
        self._wait_args = [(_L(_SYS_FUTEX), _L(self._base + (_W_DONE + i) * 8), _L(_FUTEX_WAIT)) for i in (0, 1)]
        self._ts_ref = ctypes.byref(self._ts)
        self._closed = False
        self._records = {}                         # (record format, parity) -> struct of a round's slots
        self.names, self.rounds_per_call = None, 1     # as_part_of

    def as_part_of(self, names, rounds_per_call: int) -> "ControlBlock":
        """This block's ranks are the job's ranks `names` (a host's, hcomm.control.nodes), and each
        of the job's control rounds takes `rounds_per_call` of its own: errors say so."""
        self.names, self.rounds_per_call = tuple(names), int(rounds_per_call)
        return self

    def _who(self, k: int) -> int:
        return k if self.names is None or k is None else self.names[k]

    def _call(self, seq: int) -> int:
        return seq // self.rounds_per_call

    # ---- life cycle ----------------------------------------------------------------------------
    @classmethod
    def create(cls, session: str, size: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> "ControlBlock":
        """Create the session's segment (E_PARA if it exists). The creator's handle unlinks it on close."""
        _check_machine()
        for what, v, lo in (("size", size, 1), ("slot_bytes", slot_bytes, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo or v > 1 << 30:
                raise HcclError("E_PARA", f"control block {what} {v!r}: expected an integer from {lo} to 2**30")
        nbytes = _HEADER + (size + 1) * _RECORD + size * 2 * ((8 + slot_bytes + 63) // 64 * 64)
        try:
            seg = _Mapping(segment_name(session), nbytes, _HEADER)
        except FileExistsError:
            raise HcclError("E_PARA", f"session {session!r} already has a control block") from None
        q = seg.buf.cast("q")
        q[_W_SIZE], q[_W_SLOT] = size, slot_bytes
        q.release()
        _Words(seg.buf).store(_W_MAGIC, MAGIC)      # release: the header before it
        return cls(seg, session, None, owner=True)

    @classmethod
    def adopt(cls, session: str) -> "ControlBlock":
        """The creator's handle on an existing block (it resets the block and unlinks it on close),
        for a process that takes over from a creator that died without closing it."""
        try:
            seg = _Mapping(segment_name(session), header_bytes=_HEADER)
        except FileNotFoundError:
            raise HcclError("E_NOT_FOUND", f"session {session!r} has no control block to adopt") from None
        return cls(seg, session, None, owner=True)

    @classmethod
    def attach(cls, session: str, rank: int) -> "ControlBlock":
        """Attach as `rank`, recording this process so peers can tell when it dies."""
        try:
            seg = _Mapping(segment_name(session), header_bytes=_HEADER)
        except FileNotFoundError:
            raise HcclError("E_NOT_FOUND", f"session {session!r} has no control block", rank=rank) from None
        block = cls(seg, session, None, owner=False)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < block.size:
            block.close()
            raise HcclError("E_PARA", f"rank {rank!r}: the control block has ranks 0..{block.size - 1}")
        block.rank = rank
        r = block._rec(rank)
        q = block._q
        if q[r + _R_STATE] == _ATTACHED and _proc_start_time(q[r + _R_PID]) == q[r + _R_START] \
                and q[r + _R_PID] != os.getpid():
            block.close()
            raise HcclError("E_PARA", f"rank {rank} is already attached by live process {q[r + _R_PID]}", rank=rank)
        q[r + _R_PID], q[r + _R_START] = os.getpid(), _proc_start_time(os.getpid())
        block._w.store(r + _R_STATE, _ATTACHED)     # release: the pid and start time before it
        return block

    def leave(self):
        """This rank makes no more calls this run (it returned): peers waiting for it get E_PARA at
        once. The handle stays attached; the creator's reset() brings the rank back for a new run."""
        if self.rank is not None and not self._closed:
            self._w.store(self._rec(self.rank) + _R_STATE, _LEFT)
            self._break()

    def close(self):
        """Detach. A rank's handle marks it closed (waiters for it get E_PARA at once); the creator's
        unlinks the segment (mappings other processes hold stay valid until they close)."""
        if self._closed:
            return
        self._closed = True
        if self.rank is not None:
            self._w.store(self._rec(self.rank) + _R_STATE, _CLOSED)
            self._break()
        self._release()
        if self._owner:
            try:
                self._seg.unlink()
            except FileNotFoundError:
                pass

    def reset(self):
        """Creator only, while no rank is inside a call (between runs): sequences restart at 0, any
        abort is cleared, ranks that left are back and closed ones count as not yet attached, so a
        new run can follow a failed one. Handles that stay attached carry on from seq 0."""
        if not self._owner:
            raise HcclError("E_PARA", "only the control block's creator may reset it", rank=self.rank)
        q = self._q
        for j in range(self.size + 1):
            r = self._rec(j)
            q[r + _R_SEQ], q[r + _R_CODE], q[r + _R_RLEN], q[r + _R_SLEEP] = 0, 0, 0, 0
            if q[r + _R_STATE] == _CLOSED:      # a rank that closed may attach again for this run
                q[r + _R_STATE] = _DETACHED
            elif q[r + _R_STATE] == _LEFT:
                q[r + _R_STATE] = _ATTACHED
        q[_W_ABORT], q[_W_DONE], q[_W_DONE + 1] = 0, 0, 0

    def _release(self):
        self._sleepers.release()
        self._q.release()
        self._seg.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- abort ---------------------------------------------------------------------------------
    def abort(self, code: str, reason: str, seq: int = -1):
        """Fail every current and future wait of the session with `code` (an HCCL result name)."""
        if code not in HCCL_RESULT:
            raise HcclError("E_PARA", f"unknown HCCL result code {code!r}", rank=self.rank)
        if self._closed:
            raise HcclError("E_IN_STATUS", "abort on a closed control block handle", rank=self.rank)
        who = self.size if self.rank is None else self.rank
        r = self._rec(who)
        raw = reason.encode("utf-8", "replace")[:REASON_BYTES]
        self._seg.buf[r * 8 + _WORDS:r * 8 + _WORDS + len(raw)] = raw
        q = self._q
        q[r + _R_RLEN], q[r + _R_ASEQ], q[r + _R_CODE] = len(raw), seq, HCCL_RESULT[code]
        if q[_W_ABORT] == 0:               # the first abort is the one reported
            self._w.store(_W_ABORT, who + 1)    # release: its record before it
        self._break()

    def abort_error(self):
        """The session's abort as an HcclError for this rank, or None."""
        who = self._w.load(_W_ABORT)      # acquire: the aborter's record is visible
        if not who:
            return None
        r = self._rec(who - 1)
        raw = bytes(self._seg.buf[r * 8 + _WORDS:r * 8 + _WORDS + self._q[r + _R_RLEN]]).decode("utf-8", "replace")
        origin = "the driver" if who - 1 == self.size else f"rank {self._who(who - 1)}"
        if self._q[r + _R_ASEQ] >= 0:
            origin += f" in collective #{self._q[r + _R_ASEQ]}"
        return HcclError(_CODE_NAMES.get(self._q[r + _R_CODE], "E_INTERNAL"), f"aborted by {origin}: {raw}",
                         rank=self._who(self.rank), cause=Cause.ABORTED,
                         peers=() if who - 1 == self.size else (self._who(who - 1),))

    # ---- the rendezvous ------------------------------------------------------------------------
    def allgather(self, seq: int, payload: bytes, deadline: float | None, op: str | None = None) -> list:
        """Every rank's payload for collective #seq (this rank's own object at its index).

        seq must be this rank's previous seq + 1 (0 first); deadline is a time.monotonic() value or
        None; `op` names the operation in errors. A loop of small ops runs this thousands of times
        a second, each run after seven other processes had the core, so it touches little: the
        slots' places are computed once (`_slot_at`), and the abort word is read plainly (the
        acquire load is abort_error's, when it is set)."""
        return self._read(self._publish(seq, payload, deadline, op), payload)

    def allgather_records(self, seq: int, payload: bytes, layout, deadline: float | None, op: str | None = None):
        """ControlPlane.allgather_records: every rank's slot of the round unpacked in place, in
        one call (a slot's length word, the record, then the rest of the stride up to the rank's
        next slot of this parity: the other parity's slot lies between)."""
        slots = self._publish(seq, payload, deadline, op)
        n, stride = len(payload), self._stride
        parity = seq & 1
        key = (layout.format, parity)
        got = self._records.get(key)
        if got is None:                            # (a payload fits its slot: _publish checked)
            before, after = parity * stride, (1 - parity) * stride + stride - 8 - n
            got = self._records[key] = _struct.Struct(f"<{before}xq{layout.format.lstrip('<')}{after}x")
        columns = tuple(zip(*got.iter_unpack(self._seg.buf[self._slots:self._slots + 2 * stride * self.size])))
        if columns[0].count(n) != self.size:
            return None, self._read(slots, payload)
        return columns[1:], None

    def _read(self, slots, payload) -> list:
        """Every rank's payload of the round just waited for (this rank's own: `payload`)."""
        q, m = self._q, self._map                  # (an mmap's slice: one bytes copy a slot, no view made)
        out = [m[off + 8:off + 8 + q[off >> 3]] for off in slots]
        out[self.rank] = payload
        return out

    def _publish(self, seq: int, payload: bytes, deadline, op) -> list:
        """Publish this rank's payload of round `seq` and wait until every rank has: the round's
        slots (their places)."""
        q, rank = self._q, self.rank
        if rank is None or self._closed:
            raise HcclError("E_IN_STATUS", "allgather needs an attached, open rank handle", rank=self._who(rank), op=op)
        at = self._seq_at[rank]
        if seq != q[at]:
            raise HcclError("E_INTERNAL", f"control round #{seq} out of order: this rank's next is #{q[at]}",
                            rank=self._who(rank), op=op)
        n = len(payload)
        if n > self.slot_bytes:
            raise HcclError("E_PARA", f"control payload of {n} bytes exceeds the slot ({self.slot_bytes} bytes): "
                                      f"send it over the data plane", rank=self._who(rank), op=op)
        if q[_W_ABORT]:
            raise self.abort_error()
        slots = self._slot_at[seq & 1]
        off = slots[rank]
        q[off >> 3] = n
        self._seg.buf[off + 8:off + 8 + n] = payload
        target = seq + 1
        self._w.store(at, target)                  # release: the payload before it
        self._wait(target, deadline, seq, op)
        return slots

    def barrier(self, seq: int, deadline: float | None, op: str | None = "barrier"):
        self.allgather(seq, b"", deadline, op)

    # ---- waiting -------------------------------------------------------------------------------
    def _wait(self, target, deadline, seq, op):
        q, p, seq_at = self._q, self.size, self._seq_at
        done_at = _W_DONE + (seq & 1)
        j, spins, next_check, yield_until = 0, 0, None, 0.0
        while True:
            while j < p and q[seq_at[j]] >= target:     # sequences only grow: arrived ranks stay arrived
                j += 1
            if j == p:
                self._announce_done(target, done_at)
                return
            if q[_W_ABORT]:
                raise self.abort_error()
            if spins < SPINS:
                spins += 1
                if spins == SPINS:
                    yield_until = time.monotonic() + YIELD_S
                os.sched_yield()
                continue
            if YIELD_S and time.monotonic() < yield_until:
                os.sched_yield()
                continue
            done = q[done_at]                   # read before the last look: a completion after it changes it
            if q[seq_at[j]] >= target:
                continue
            if q[_W_ABORT]:
                raise self.abort_error()
            now = time.monotonic()
            if next_check is None:
                next_check = now + LIVENESS_S
            elif now >= next_check:
                self._check_missing(target, seq, op)
                next_check = now + LIVENESS_S
            if deadline is not None and now >= deadline:
                self._check_missing(target, seq, op)
                missing = [k for k in range(p) if q[seq_at[k]] < target]
                where = ", ".join(f"rank {self._who(k)}: " + (
                    "never attached" if q[seq_at[k] + _R_STATE] == _DETACHED else
                    f"last at #{self._call(q[seq_at[k]] - 1)}" if q[seq_at[k]] else "none yet") for k in missing[:8])
                missing = [self._who(k) for k in missing]
                raise HcclError("E_TIMEOUT", f"collective #{self._call(seq)}: ranks {missing} have not arrived by the "
                                             f"deadline ({where})", rank=self._who(self.rank), op=op,
                                cause=Cause.TIMEOUT, peers=missing)
            sleep = BLOCK_SLICE_S if deadline is None else min(BLOCK_SLICE_S, max(deadline - now, 0.0))
            if done & _BROKEN:       # a close (an abort raised above): report it if it concerns us
                self._check_missing(target, seq, op)
                sleep = min(sleep, 0.001)
            self._ts.tv_sec = int(sleep)
            self._ts.tv_nsec = int((sleep - int(sleep)) * 1e9)
            sleep_at = seq_at[self.rank] + _R_SLEEP
            q[sleep_at] = target
            if q[seq_at[j]] < target:           # announced first: the completer sees us or we see it
                _syscall(*self._wait_args[done_at - _W_DONE], _L(done), self._ts_ref, None, _L(0))
            q[sleep_at] = 0

    def _announce_done(self, target, done_at):
        """Every rank has published seq: make their payloads visible here, mark it done and wake
        ranks that sleep for it (one syscall).

        Visibility (module docstring: Ordering): the done word already set (acquire) carries every
        payload through its completer; else this rank completes: an acquire load of each rank's
        sequence, then the done word (released to later readers).
        Wake-ups: a sleeper writes its _R_SLEEP word, and the kernel's futex wait compares the done
        word after a full barrier; the completer stores the done word before reading _R_SLEEP words,
        its later loads held behind the store (`store_fenced`). So either the sleeper's compare sees
        the new done word or the completer sees the sleeper (failing both, it would wake after
        BLOCK_SLICE_S)."""
        w = self._w
        if w.load(done_at) != target & _MASK:
            mine = self._seq_at[self.rank]
            for at in self._seq_at:
                if at != mine:
                    w.load(at)
            w.store_fenced(done_at, target & _MASK)
            # the rank that stores the done word wakes the sleepers it sees; one that finds it
            # stored needs not: a sleeper the storer missed announced itself after the store, so
            # its futex compare sees the new done word and does not sleep
            if target in self._sleepers.tolist():
                _syscall(*self._wake_args[done_at - _W_DONE])

    def _check_missing(self, target, seq, op):
        """A missing rank that closed its handle or whose process is gone will never arrive."""
        q = self._q
        for k in range(self.size):
            r = self._rec(k)
            if q[r + _R_SEQ] >= target:
                continue
            state = self._w.load(r + _R_STATE)     # acquire: the pid and start time written before it
            pid = q[r + _R_PID]
            if state in (_CLOSED, _LEFT):
                raise HcclError("E_PARA", f"collective #{self._call(seq)}: rank {self._who(k)} returned without "
                                          f"calling it (ranks made different sequences of collective calls)",
                                rank=self._who(self.rank), op=op, cause=Cause.PEER_RETURNED, peers=(self._who(k),),
                                detail={"missed": "call"})
            if state == _ATTACHED and _proc_start_time(pid) != q[r + _R_START]:
                raise HcclError("E_REMOTE", f"collective #{self._call(seq)}: rank {self._who(k)} (pid {pid}) died "
                                            f"before arriving", rank=self._who(self.rank), op=op, cause=Cause.PEER_LOST,
                                peers=(self._who(k),))

    # ---- helpers -------------------------------------------------------------------------------
    def _rec(self, who: int) -> int:
        """Word index of a record (ranks 0..size-1, the creator at size)."""
        return (_HEADER + who * _RECORD) >> 3

    def _break(self):
        """Change both done words and wake every sleeper, so none sleeps through an abort or close."""
        for i in (0, 1):
            self._w.store(_W_DONE + i, self._q[_W_DONE + i] | _BROKEN)    # release: the state or abort before it
            _syscall(*self._wake_args[i])

    def asleep_for(self, rank: int) -> int:
        """The round + 1 that `rank` sleeps in its futex for (0: it is not asleep)."""
        return int(self._sleepers[rank])

    def status(self) -> list:
        """Per rank (published seq count, pid, state) for diagnostics."""
        names = {_DETACHED: "detached", _ATTACHED: "attached", _CLOSED: "closed", _LEFT: "left"}
        return [(int(self._q[self._rec(j) + _R_SEQ]), int(self._q[self._rec(j) + _R_PID]),
                 names.get(self._q[self._rec(j) + _R_STATE], "?")) for j in range(self.size)]
