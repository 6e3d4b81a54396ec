"""The half of a transport that ranks sharing no memory all need: `PeerEndpoint`.

An inbox demultiplexed by (src, tag), send handles completed by the receiver's acknowledgement,
peers lost or returned, abort notices per communicator scope: the socket, Ray object-store and
MPI transports only say how a frame reaches a peer (and, for MPI, who drives progress while a
rank waits: `_idle`).
"""
from __future__ import annotations

import abc
import itertools
import threading
import time
from collections import deque
from typing import Optional

import numpy as np

from topologies.errors import HcclError

from .base import (ABORT_NOTICE, POLL_S, PROBE_AFTER_S, PROBE_EVERY_S, AbortState, Message, Registry, Transport,
                   check_rank, consume_exited, consume_timeout, peer_lost, remaining, take_exited, take_timeout)

_EMPTY_NOTICE = np.zeros(0, dtype=np.uint8)


# ---- tags and meta as JSON, for the transports that frame them so (socket, MPI) ----------------------

def json_tuples(x):
    """JSON turns tuples into lists; a tag is hashable, so every list in one was a tuple."""
    return tuple(json_tuples(v) for v in x) if isinstance(x, list) else x


def json_plain(o):
    """json.dumps' `default`: numpy scalars as Python ones."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not a JSON value")


def wire_dtype(dtype: np.dtype) -> str:
    """A dtype as a frame or a record names it: its array-protocol string ("<f4"), except for a
    type numpy knows only as raw bytes ("<V2"), ml_dtypes' bfloat16, which goes by its name."""
    return dtype.name if dtype.kind == "V" else dtype.str


def dtype_from_wire(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: F401 - registers bfloat16's name with numpy
        return np.dtype(name)


BYE_GRACE_S = 0.5
"""How long a peer's goodbye said in shared memory (its steps word) waits for the transport's own
goodbye, which follows anything the peer sent before it (an abort notice) in order."""


class SendHandle:
    """A posted send of a transport between processes: completed by the receiver's acknowledgement."""
    __slots__ = ("src", "dst", "tag", "id", "reply", "done", "keep")

    def __init__(self, src, dst, tag, msg_id, keep=None):
        self.src, self.dst, self.tag, self.id = src, dst, tag, msg_id
        self.reply = None
        self.done = False
        self.keep = keep        # what must live until the ack (the slice, an object ref)


class RemoteMessage(Message):
    """A message that crossed a process boundary; `consumed` acknowledges it to the sender."""
    __slots__ = ("_endpoint", "_id", "_acked")

    def __init__(self, endpoint, src, tag, data, meta, msg_id):
        super().__init__(src, endpoint.rank, tag, data, meta)
        self._endpoint, self._id, self._acked = endpoint, msg_id, False

    def consumed(self, reply=None) -> None:
        if self._acked:
            return
        self._acked = True
        data, self.data = self.data, None   # the receiver's copy (or object-store view) is free now
        self._endpoint._send_ack(self.src, self._id, reply)
        self._endpoint._release(data)


class PeerEndpoint(Transport):
    """One rank's endpoint of a transport whose ranks share no memory.

    Subclasses deliver frames: `_send_data(handle, view, meta)` gets the slice to `handle.dst`,
    which calls `deliver(src, tag, data, meta, msg_id)`; `_send_ack(src, msg_id, reply)` gets
    the reply back, where `acknowledged(msg_id, reply)` completes the handle. `peer_down(peer,
    reason)` records a peer that is lost (every wait on it fails), `peer_returned(peer, data,
    acks)` one that returned, once every message (`data`) or acknowledgement (`acks`) it sent has
    arrived: a rank's goodbye may overtake its last acks on another connection or call; `_probe(peer)` (optional) is called while
    a wait on `peer` lasts, to find out whether it still lives (for transports that learn of a
    dead peer only by asking).

    `watch_peer(peer)` makes every wait fail once `peer` is lost, not only waits on it: a rank
    that knows its op cannot complete without `peer` (the fault plan crashes it) is told as soon
    as it is gone, as HCCL's heartbeat tells every rank of a LOST one (docs/references.md §10.3),
    whichever peer it happens to wait for; watched peers are probed during every long wait, and
    `_watch(peer)` (optional) makes sure a death will be seen."""

    def __init__(self, rank: int, size: int, timeout_s: float | None = None):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise HcclError("E_PARA", f"size must be a positive int, got {size!r}")
        self.rank = check_rank(rank, size, "rank")
        self.size = int(size)
        self.timeout_s = timeout_s
        self._abort = AbortState()
        self._registry = Registry()
        self.cond = threading.Condition(threading.Lock())   # guards everything below; notified on any change
        self._inbox = {}             # (src, tag) -> deque of RemoteMessage
        self._pending = {}           # msg id -> SendHandle
        self._ids = itertools.count()
        self._down = {}              # lost peer -> why
        self._no_more_data = set()   # peers that returned, every message they sent arrived
        self._no_more_acks = set()   # peers that returned, every acknowledgement they sent arrived
        self._acks_from = [0] * self.size   # acknowledgements received from each peer
        self._watched = set()        # peers whose loss fails every wait (watch_peer)
        self._closed = False

    # registered memory, deadlines, abort ----------------------------------------------------------
    def _own(self, rank, op=None):
        if rank != self.rank:
            raise HcclError("E_PARA", f"this endpoint serves rank {self.rank}, not rank {rank!r}", rank=self.rank, op=op)

    def register(self, rank, name, array):
        self._own(rank)
        self._registry.register(rank, name, array)

    def deregister(self, rank, name):
        self._registry.deregister(rank, name)

    def region(self, rank, name):
        return self._registry.region(rank, name)

    def deadline(self):
        return None if not self.timeout_s else time.monotonic() + self.timeout_s

    @property
    def aborted(self):
        return self._abort.aborted

    def abort(self, code: str, reason: str) -> None:
        self._abort.set(code, reason)
        with self.cond:
            self.cond.notify_all()

    def abort_scope(self, scope: str, code: str, reason: str, after=None) -> None:
        """Fail every wait on `scope`'s tags, here and at every peer (one notice frame each, best
        effort: a peer already gone needs none), but those of the scope's control rounds before
        `after` (the rounds this rank had finished: AbortState). Other scopes' traffic goes on."""
        self._abort.set_scope(scope, code, reason, after)
        with self.cond:
            self.cond.notify_all()
            peers = [q for q in range(self.size) if q != self.rank and q not in self._down
                     and q not in self._no_more_acks]
        for q in peers:
            try:
                self._send_data(SendHandle(self.rank, q, (ABORT_NOTICE, scope), -1), _EMPTY_NOTICE,
                                (code, reason, after))
            except (HcclError, OSError):
                pass

    def mark_exited(self, rank: int) -> None:
        if rank == self.rank:
            self._announce_exit()
        else:
            self.peer_returned(rank, data=True, acks=True)

    def watch_peer(self, peer: int) -> None:
        """Until unwatch_peer(peer): every wait fails with E_REMOTE naming `peer` once it is lost."""
        peer = check_rank(peer, self.size, "peer", self.rank)
        if peer == self.rank:
            raise HcclError("E_PARA", "a rank cannot watch itself", rank=self.rank)
        with self.cond:
            self._watched.add(peer)
            self.cond.notify_all()
        self._watch(peer)

    def unwatch_peer(self, peer: int) -> None:
        with self.cond:
            self._watched.discard(peer)

    def lost(self, peer: int):
        """Why `peer` is lost (its connection broke, its actor died), or None."""
        with self.cond:
            return self._down.get(peer)

    def _check_watched(self, me, op) -> None:
        """Lock held: a watched peer that is lost fails this wait."""
        for peer in self._watched:
            if peer in self._down:
                raise peer_lost(peer, me, self._down[peer], op)

    # data plane ---------------------------------------------------------------------------------------
    def post(self, src, dst, tag, region, start, stop, meta=None):
        return self.post_view(src, dst, tag, self.region(src, region)[start:stop], meta)

    def post_view(self, src, dst, tag, view, meta=None):
        self._own(src)
        dst = check_rank(dst, self.size, "dst", self.rank)
        if dst == self.rank:
            raise HcclError("E_PARA", "a transport between processes cannot send to its own rank", rank=self.rank)
        self._abort.check(self.rank, None)
        handle = SendHandle(src, dst, tag, next(self._ids))
        with self.cond:
            self._pending[handle.id] = handle
        try:
            view = np.asarray(view)
            # ascontiguousarray would turn a 0-d array into shape (1,): copy only what needs it
            self._send_data(handle, view if view.flags.c_contiguous else np.ascontiguousarray(view), meta)
        except BaseException:
            with self.cond:
                self._pending.pop(handle.id, None)
            raise
        return handle

    def take(self, src, dst, tag, deadline=None, op=None) -> Message:
        self._own(dst, op)
        src = check_rank(src, self.size, "src", self.rank, op)
        key = (src, tag)
        inbox = self._inbox
        with self.cond:
            queue = inbox.get(key)
            if not queue:
                self._wait_until(lambda: bool(inbox.get(key)), src, tag, deadline, op, False)
                queue = inbox[key]
            msg = queue.popleft()
            if not queue:
                del inbox[key]
            return msg

    def ready(self, src, dst, tag) -> bool:
        self._own(dst, "ready")
        key = (check_rank(src, self.size, "src", self.rank, "ready"), tag)
        with self.cond:
            if not self._inbox.get(key):
                self._idle(0.0)          # one step of progress where the ranks drive it (MPI)
            return bool(self._inbox.get(key))

    def is_consumed(self, handle: SendHandle) -> bool:
        with self.cond:
            if not handle.done:
                self._idle(0.0)
            return handle.done

    def wait_consumed(self, handle: SendHandle, deadline=None, op=None):
        if not handle.done:
            with self.cond:
                self._wait_until(lambda: handle.done, handle.dst, handle.tag, deadline, op, True)
        return handle.reply

    def wait_for(self, peer, ready, deadline=None, op=None, for_acks=False, tag=None) -> None:
        """Wait until `ready()`: a look at what `peer`, on this rank's host, changes in shared memory
        and rings this rank's doorbell for (its step words, hcomm.transports.host_steps). Fails as
        `take` does (`for_acks`: as `wait_consumed`, the wait being for `peer` to read what this
        rank exposed); `tag` is the traffic's, for the scope of an abort."""
        if not ready():
            steps = self.host_steps
            with self.cond:
                self._wait_until(ready, peer, tag, deadline, op, for_acks,
                                 None if steps is None else lambda: steps.exited(peer))

    def _wait_until(self, ready, peer, tag, deadline, op, for_acks, said_bye=None) -> None:
        """The one wait loop (lock held): until `ready()`, failing when this rank is aborted, `peer`
        (or a watched peer) is lost, `peer` has returned without it (`for_acks`: without
        consuming what this rank sent, else without sending what it waits for; `said_bye()`: it
        said so another way than the transport's goodbye) or `deadline` passes; between checks
        the endpoint idles (`_idle`) until something changes."""
        me = self.rank
        probe_at = time.monotonic() + PROBE_AFTER_S
        returned = self._no_more_acks if for_acks else self._no_more_data
        bye_seen = None              # when said_bye() was first seen without the transport's goodbye
        while not ready():
            self._abort.check(me, op, tag)
            if peer in self._down:
                raise peer_lost(peer, me, self._down[peer], op)
            if self._watched:
                self._check_watched(me, op)
            if peer not in returned and said_bye is not None and bye_seen is None and said_bye():
                bye_seen = time.monotonic()
            # a goodbye said in shared memory can overtake what the peer sent before it on the
            # transport (an abort notice, whose error is the one to raise): it counts once the
            # transport's own goodbye is in, or a moment after
            if (peer in returned or (bye_seen is not None and time.monotonic() - bye_seen >= BYE_GRACE_S)) \
                    and not ready():
                # (a peer's word set just before its goodbye counts)
                raise consume_exited(me, peer, tag, op) if for_acks else take_exited(peer, me, tag, op)
            left = remaining(deadline)
            if left is not None and left <= 0:
                if bye_seen is not None:     # it had said goodbye: that, not the deadline, is why
                    raise consume_exited(me, peer, tag, op) if for_acks else take_exited(peer, me, tag, op)
                raise consume_timeout(me, peer, self.timeout_s, op) if for_acks else \
                    take_timeout(peer, me, self.timeout_s, op)
            probe_at = self._maybe_probe(peer, probe_at)
            self._idle(POLL_S if left is None else min(POLL_S, left), for_acks, ready)

    def _maybe_probe(self, peer, probe_at):
        """Ask the subclass, now and then during a long wait, whether `peer` (and every watched
        peer) still lives (called with the lock held; the probe must not block)."""
        now = time.monotonic()
        if now < probe_at:
            return probe_at
        for who in {peer} | self._watched:
            if who not in self._down:
                reason = self._probe(who)
                if reason is not None:
                    self._down.setdefault(who, reason)
        return now + PROBE_EVERY_S

    # the inbound interface: what a subclass, or whatever carries its frames (an MPI hub, a
    # host's shared-memory rings), calls as frames arrive. `cond` is the endpoint's lock and the
    # condition its waits sleep on; the *_locked calls are made with it held.
    def deliver(self, src, tag, data, meta, msg_id) -> None:
        """A data frame from `src` arrived (a message to take on `tag`)."""
        msg = RemoteMessage(self, src, tag, data, meta, msg_id)
        with self.cond:
            self.enqueue_locked(msg)

    def enqueue_locked(self, msg) -> None:
        """Queue an arrived message (lock held); an abort notice aborts its scope instead."""
        tag = msg.tag
        if type(tag) is tuple and len(tag) == 2 and tag[0] == ABORT_NOTICE:
            code, reason, after = msg.meta
            self._abort.set_scope(tag[1], code, reason, after)
            self.cond.notify_all()
            return
        self._inbox.setdefault((msg.src, msg.tag), deque()).append(msg)
        self.cond.notify_all()

    def acknowledged(self, msg_id, reply) -> None:
        """The receiver consumed message `msg_id` and replied `reply`."""
        with self.cond:
            self.complete_locked(msg_id, reply)

    def complete_locked(self, msg_id, reply) -> None:
        """A send acknowledged (lock held)."""
        handle = self._pending.pop(msg_id, None)
        if handle is not None:
            self._acks_from[handle.dst] += 1
            handle.reply, handle.done, handle.keep = reply, True, None
            self.cond.notify_all()

    def peer_down(self, peer, reason) -> None:
        """`peer` is lost (`reason` says how): every wait on it fails."""
        with self.cond:
            self._down.setdefault(peer, reason)
            self.cond.notify_all()

    def peer_returned(self, peer, data=False, acks=False) -> None:
        """`peer` returned: every message (`data`) or acknowledgement (`acks`) it sent has arrived."""
        with self.cond:
            if data:
                self._no_more_data.add(peer)
            if acks:
                self._no_more_acks.add(peer)
            self.cond.notify_all()

    # what subclasses provide --------------------------------------------------------------------------------
    @abc.abstractmethod
    def _send_data(self, handle, view, meta) -> None:
        """Get `view` to `handle.dst` (which calls deliver there)."""

    @abc.abstractmethod
    def _send_ack(self, src, msg_id, reply) -> None:
        """Get `reply` back to `src` (which calls acknowledged there)."""

    def _idle(self, timeout: float, for_acks: bool = False, ready=None) -> None:
        """Wait (lock held) up to `timeout` s for something to change (`for_acks`: the wait is
        for an acknowledgement, so a transport may let one that only brings data sleep on;
        `ready`: the wait's own check, which a transport that reads shared memory between its
        doorbell and its sleep makes there too).
        Transports whose frames arrive on threads of their own just wait to be notified; one
        whose waiting ranks must drive the progress themselves (MPI) overrides it."""
        self.cond.wait(timeout)

    def _release(self, data) -> None:
        """A consumed message's array, which the endpoint may reuse for a later message."""

    def _announce_exit(self) -> None:
        """Tell the peers this rank sends and consumes nothing more (best effort)."""

    def _watch(self, peer) -> None:
        """Make sure the loss of watched `peer` will be seen (without blocking)."""

    def _probe(self, peer) -> Optional[str]:
        """Find out, without blocking and with the endpoint's lock held, whether `peer` is still
        alive: None if it may be, else why it is not."""
        return None
