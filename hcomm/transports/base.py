"""The Transport protocol every hcomm transport implements, and the pieces they share.

A transport moves slices of ranks' registered buffers between ranks, gloo's UnboundBuffer shape:
the sender posts a slice and gets a handle, the receiver takes the next message on (src, dst, tag),
reads or reduces from `message.data`, and calls `message.consumed(reply)`; the sender's
`wait_consumed(handle)` returns that reply, and only then may it overwrite the slice (zero-copy:
HCCL's notify record/wait). Every wait takes a deadline (`transport.deadline()`, from
HCCL_EXEC_TIMEOUT) and is woken by `abort`, so a failure becomes an HcclError instead of a hang.

Shared here: the wording of every wait failure (so every transport reports a timeout, an exited
peer or a lost peer the same way), the abort state, the named-buffer registry, and `PeerEndpoint`,
the half of a transport that ranks sharing no memory all need (an inbox demultiplexed by
(src, tag), send handles completed by acknowledgements, peers lost or exited): the socket and Ray
object-store transports only say how a frame reaches a peer.
"""
from __future__ import annotations

import abc
import itertools
import threading
import time
from collections import deque
from typing import Any, Hashable, Optional, Protocol, runtime_checkable

import numpy as np

from topologies.errors import HcclError

POLL_S = 0.05      # longest sleep of a waiter between checks; wake-ups on progress are immediate
PROBE_AFTER_S = 0.5  # a wait this long starts asking (where a transport must ask) whether its peer lives
PROBE_EVERY_S = 0.5


# ---- the protocol ---------------------------------------------------------------------------------

class Message(abc.ABC):
    """What `take` returns: `data` (a numpy array to read or reduce from; do not keep it past
    `consumed`), the sender's `meta`, and `consumed(reply)`, which completes the sender's handle."""
    __slots__ = ("src", "dst", "tag", "data", "meta")

    def __init__(self, src: int, dst: int, tag, data, meta):
        self.src, self.dst, self.tag, self.data, self.meta = src, dst, tag, data, meta

    @abc.abstractmethod
    def consumed(self, reply=None) -> None:
        """Tell the sender its slice may be reused; `reply` reaches its wait_consumed."""


@runtime_checkable
class Transport(Protocol):
    """Tagged, deadline-bounded, zero-copy (where memory allows) channels among `size` ranks.

    Ranks are ints in [0, size); a tag is any hashable value the transport can carry (for the
    transports between processes: str, int, float, bool, None, or tuples of these). An endpoint of
    a transport between processes serves one rank (`rank`); the in-process one serves all."""

    size: int
    timeout_s: Optional[float]

    def register(self, rank: int, name: str, array: np.ndarray) -> None:
        """Make `array` addressable as buffer `name` of `rank` (replaces an earlier one)."""

    def deregister(self, rank: int, name: str) -> None:
        """Forget buffer `name` of `rank`."""

    def region(self, rank: int, name: str) -> np.ndarray:
        """The array registered as `name` of `rank`; E_PTR when there is none."""

    def post(self, src: int, dst: int, tag: Hashable, region: str, start: int, stop: int, meta: Any = None):
        """Send region[start:stop] (first axis) of `src`'s buffer `region` to `dst`; returns a
        handle for `wait_consumed`. Does not wait; `src` must not write the slice until then."""

    def post_view(self, src: int, dst: int, tag: Hashable, view: np.ndarray, meta: Any = None):
        """Like `post`, for an array that is not registered."""

    def take(self, src: int, dst: int, tag: Hashable, deadline: Optional[float] = None,
             op: Optional[str] = None) -> Message:
        """Wait for the next message from `src` to `dst` on `tag` (messages on one (src, dst, tag)
        arrive in posting order). E_TIMEOUT past `deadline` (time.monotonic() seconds), E_REMOTE
        when `src` is lost, E_PARA when `src` has exited without sending it, the abort's code
        once aborted."""

    def wait_consumed(self, handle, deadline: Optional[float] = None, op: Optional[str] = None):
        """Wait until the receiver has called `consumed(reply)` on the message; returns the reply.
        Fails like `take`."""

    def deadline(self) -> Optional[float]:
        """The deadline of a wait that starts now (None when there is no timeout)."""

    def abort(self, code: str, reason: str) -> None:
        """Fail every wait on this transport, now and later, with HcclError(code, 'aborted: reason')."""

    def mark_exited(self, rank: int) -> None:
        """`rank` will post and consume nothing more: waits on it fail at once."""

    def close(self) -> None:
        """Release threads, sockets and references; waits in progress are aborted."""


# ---- failure wording, one place for every transport -------------------------------------------------

def _op_suffix(op):
    return f" ({op})" if op else ""


def waiting_for_data(src, op=None) -> str:
    return f"data from rank {src}" + _op_suffix(op)


def waiting_for_consumer(dst, op=None) -> str:
    return f"rank {dst} to take its data" + _op_suffix(op)


def take_timeout(src, dst, timeout_s, op) -> HcclError:
    return HcclError("E_TIMEOUT", f"no data from rank {src} within {timeout_s or 0:g} s (HCCL_EXEC_TIMEOUT)",
                     rank=dst, op=op)


def consume_timeout(src, dst, timeout_s, op) -> HcclError:
    return HcclError("E_TIMEOUT", f"rank {dst} did not consume the data sent to it within {timeout_s or 0:g} s "
                     "(HCCL_EXEC_TIMEOUT)", rank=src, op=op)


def take_exited(src, dst, tag, op) -> HcclError:
    return HcclError("E_PARA", f"rank {src} returned without sending what this rank waits for (tag {tag!r})",
                     rank=dst, op=op)


def consume_exited(src, dst, tag, op) -> HcclError:
    return HcclError("E_PARA", f"rank {dst} returned without receiving what this rank sent (tag {tag!r})",
                     rank=src, op=op)


def peer_lost(peer, me, reason, op) -> HcclError:
    return HcclError("E_REMOTE", f"lost rank {peer}: {reason}", rank=me, op=op)


def connect_timeout(peer, me, timeout_s, reason) -> HcclError:
    return HcclError("E_TIMEOUT", f"could not connect to rank {peer} within {timeout_s:g} s "
                     f"(HCCL_CONNECT_TIMEOUT): {reason}", rank=me)


def remaining(deadline) -> Optional[float]:
    return None if deadline is None else deadline - time.monotonic()


def check_rank(rank, size, what, me=None, op=None) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise HcclError("E_PARA", f"{what} must be a rank in [0, {size}), got {rank!r}", rank=me, op=op)
    return int(rank)


SCOPED = "sub"
"""First element of a scoped tag, (SCOPED, scope, tag): a sub-communicator's traffic over its
parent's transport (hccl_sim.engines.scoped). Every other tag belongs to the scope WORLD."""
WORLD = ""
ABORT_NOTICE = "abort-notice"
"""Tag of the frame `abort_scope` sends every peer: (ABORT_NOTICE, scope); its meta is (code, reason)."""


def scope_of(tag) -> str:
    """The communicator scope a tag belongs to."""
    if type(tag) is tuple and len(tag) == 3 and tag[0] == SCOPED:
        return tag[1]
    return WORLD


class AbortState:
    """The abort every transport carries: first (code, reason) wins; `check` raises it. A scoped
    abort (one communicator's, `set_scope`) fails only the waits on that scope's tags."""

    def __init__(self):
        self._abort = None
        self._scopes = {}

    def set(self, code: str, reason: str) -> None:
        if self._abort is None:
            self._abort = (code, reason)

    def set_scope(self, scope: str, code: str, reason: str) -> None:
        self._scopes.setdefault(scope, (code, reason))

    @property
    def aborted(self):
        return self._abort

    def check(self, rank, op, tag=None) -> None:
        got = self._abort
        if got is None and self._scopes and tag is not None:      # a wait on a tag: its scope's abort too
            got = self._scopes.get(scope_of(tag))
        if got is not None:
            code, reason = got
            raise HcclError(code, f"aborted: {reason}", rank=rank, op=op)


class Registry:
    """Named buffers of the ranks an endpoint serves."""

    def __init__(self):
        self._buffers = {}

    def register(self, rank, name, array) -> None:
        self._buffers[(rank, name)] = array

    def deregister(self, rank, name) -> None:
        self._buffers.pop((rank, name), None)

    def region(self, rank, name):
        try:
            return self._buffers[(rank, name)]
        except KeyError:
            raise HcclError("E_PTR", f"buffer {name!r} is not registered", rank=rank) from None


_EMPTY_NOTICE = np.zeros(0, dtype=np.uint8)


# ---- the shared half of transports between processes ---------------------------------------------------

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


class PeerEndpoint(abc.ABC):
    """One rank's endpoint of a transport whose ranks share no memory.

    Subclasses deliver frames: `_send_data(handle, view, meta)` gets the slice to `handle.dst`,
    which calls `_deliver(src, tag, data, meta, msg_id)`; `_send_ack(src, msg_id, reply)` gets
    the reply back, where `_acknowledged(msg_id, reply)` completes the handle. `_peer_down(peer,
    reason)` records a peer that is lost (every wait on it fails), `_peer_returned(peer, data,
    acks)` one that returned, once every message (`data`) or acknowledgement (`acks`) it sent has
    arrived: a rank's goodbye may overtake its last acks on another connection or call; `_probe(peer)` (optional) is called while
    a wait on `peer` lasts, to find out whether it still lives (for transports that learn of a
    dead peer only by asking)."""

    def __init__(self, rank: int, size: int, timeout_s: float | None = None):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise HcclError("E_PARA", f"size must be a positive int, got {size!r}")
        self.rank = check_rank(rank, size, "rank")
        self.size = int(size)
        self.timeout_s = timeout_s
        self._abort = AbortState()
        self._registry = Registry()
        self._cond = threading.Condition(threading.Lock())   # guards everything below; notified on any change
        self._inbox = {}             # (src, tag) -> deque of RemoteMessage
        self._pending = {}           # msg id -> SendHandle
        self._ids = itertools.count()
        self._down = {}              # lost peer -> why
        self._no_more_data = set()   # peers that returned, every message they sent arrived
        self._no_more_acks = set()   # peers that returned, every acknowledgement they sent arrived
        self._acks_from = [0] * self.size   # acknowledgements received from each peer
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
        with self._cond:
            self._cond.notify_all()

    def abort_scope(self, scope: str, code: str, reason: str) -> None:
        """Fail every wait on `scope`'s tags, here and at every peer (one notice frame each, best
        effort: a peer already gone needs none). Other scopes' traffic goes on."""
        self._abort.set_scope(scope, code, reason)
        with self._cond:
            self._cond.notify_all()
            peers = [q for q in range(self.size) if q != self.rank and q not in self._down
                     and q not in self._no_more_acks]
        for q in peers:
            try:
                self._send_data(SendHandle(self.rank, q, (ABORT_NOTICE, scope), -1), _EMPTY_NOTICE,
                                (code, reason))
            except (HcclError, OSError):
                pass

    def mark_exited(self, rank: int) -> None:
        if rank == self.rank:
            self._announce_exit()
        else:
            self._peer_returned(rank, data=True, acks=True)

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
        with self._cond:
            self._pending[handle.id] = handle
        try:
            view = np.asarray(view)
            # ascontiguousarray would turn a 0-d array into shape (1,): copy only what needs it
            self._send_data(handle, view if view.flags.c_contiguous else np.ascontiguousarray(view), meta)
        except BaseException:
            with self._cond:
                self._pending.pop(handle.id, None)
            raise
        return handle

    def take(self, src, dst, tag, deadline=None, op=None) -> Message:
        self._own(dst, op)
        src = check_rank(src, self.size, "src", self.rank, op)
        key = (src, tag)
        probe_at = time.monotonic() + PROBE_AFTER_S
        with self._cond:
            while True:
                queue = self._inbox.get(key)
                if queue:
                    msg = queue.popleft()
                    if not queue:
                        del self._inbox[key]
                    return msg
                self._abort.check(dst, op, tag)
                if src in self._down:
                    raise peer_lost(src, dst, self._down[src], op)
                if src in self._no_more_data:
                    raise take_exited(src, dst, tag, op)
                left = remaining(deadline)
                if left is not None and left <= 0:
                    raise take_timeout(src, dst, self.timeout_s, op)
                probe_at = self._maybe_probe(src, probe_at)
                self._cond.wait(POLL_S if left is None else min(POLL_S, left))

    def wait_consumed(self, handle: SendHandle, deadline=None, op=None):
        probe_at = time.monotonic() + PROBE_AFTER_S
        with self._cond:
            while not handle.done:
                self._abort.check(handle.src, op, handle.tag)
                if handle.dst in self._down:
                    raise peer_lost(handle.dst, handle.src, self._down[handle.dst], op)
                if handle.dst in self._no_more_acks:
                    raise consume_exited(handle.src, handle.dst, handle.tag, op)
                left = remaining(deadline)
                if left is not None and left <= 0:
                    raise consume_timeout(handle.src, handle.dst, self.timeout_s, op)
                probe_at = self._maybe_probe(handle.dst, probe_at)
                self._cond.wait(POLL_S if left is None else min(POLL_S, left))
        return handle.reply

    def _maybe_probe(self, peer, probe_at):
        """Ask the subclass, now and then during a long wait, whether `peer` still lives (called
        with the lock held; the probe must not block)."""
        now = time.monotonic()
        if now < probe_at:
            return probe_at
        reason = self._probe(peer)
        if reason is not None:
            self._down.setdefault(peer, reason)
        return now + PROBE_EVERY_S

    # called by subclasses --------------------------------------------------------------------------------
    def _deliver(self, src, tag, data, meta, msg_id) -> None:
        msg = RemoteMessage(self, src, tag, data, meta, msg_id)
        with self._cond:
            self._enqueue(msg)

    def _enqueue(self, msg) -> None:
        """Queue an arrived message (lock held); an abort notice aborts its scope instead."""
        tag = msg.tag
        if type(tag) is tuple and len(tag) == 2 and tag[0] == ABORT_NOTICE:
            code, reason = msg.meta
            self._abort.set_scope(tag[1], code, reason)
            self._cond.notify_all()
            return
        self._inbox.setdefault((msg.src, msg.tag), deque()).append(msg)
        self._cond.notify_all()

    def _acknowledged(self, msg_id, reply) -> None:
        with self._cond:
            handle = self._pending.pop(msg_id, None)
            if handle is not None:
                self._acks_from[handle.dst] += 1
                handle.reply, handle.done, handle.keep = reply, True, None
                self._cond.notify_all()

    def _peer_down(self, peer, reason) -> None:
        with self._cond:
            self._down.setdefault(peer, reason)
            self._cond.notify_all()

    def _peer_returned(self, peer, data=False, acks=False) -> None:
        with self._cond:
            if data:
                self._no_more_data.add(peer)
            if acks:
                self._no_more_acks.add(peer)
            self._cond.notify_all()

    # what subclasses provide --------------------------------------------------------------------------------
    @abc.abstractmethod
    def _send_data(self, handle, view, meta) -> None:
        """Get `view` to `handle.dst` (which calls _deliver there)."""

    @abc.abstractmethod
    def _send_ack(self, src, msg_id, reply) -> None:
        """Get `reply` back to `src` (which calls _acknowledged there)."""

    def _release(self, data) -> None:
        """A consumed message's array, which the endpoint may reuse for a later message."""

    def _announce_exit(self) -> None:
        """Tell the peers this rank sends and consumes nothing more (best effort)."""

    def _probe(self, peer) -> Optional[str]:
        """Find out, without blocking and with the endpoint's lock held, whether `peer` is still
        alive: None if it may be, else why it is not."""
        return None
