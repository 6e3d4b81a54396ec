"""In-process transport: registered memory and zero-copy, tagged, deadline-bounded channels.

Each rank registers named buffers; a send posts a reference to a slice of a registered buffer on
the (src, dst, tag) channel, and the receiver gets a numpy view of the sender's memory: no pickling
and no copy. The sender learns that its slice was consumed (and may overwrite it) through the
message's completion, HCCL's notify record/wait. Every wait has a deadline and is woken by an
abort, which turns a failure anywhere into an HcclError everywhere instead of a hang.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from topologies.errors import Cause, HcclError

from .base import (POLL_S as _POLL_S, AbortState, Message as _MessageBase, Registry, Transport, consume_exited,
                   consume_timeout, remaining, take_exited, take_timeout, waiting_for_consumer, waiting_for_data)

STALL_S = 2.0    # every live rank waiting this long with no progress anywhere is a deadlock


class Watch:
    """Who is waiting for what, to turn a deadlock among ranks into an error instead of a hang.

    Any message posted, consumed or rendezvous joined counts as progress. When every rank that
    has not returned is waiting and nothing has progressed for STALL_S, every waiter raises."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._waiting = {}
        self._exited = set()
        self._progress = 0
        self._stalled = None          # (progress count, since) while everyone waits

    def progress(self):
        with self._lock:
            self._progress += 1

    def exited(self, rank):
        with self._lock:
            self._exited.add(rank)
            self._progress += 1

    def waiting(self, rank, what):
        with self._lock:
            self._waiting[rank] = what

    def waiting_ranks(self) -> dict:
        """rank -> what it waits for, of the ranks inside a wait now."""
        with self._lock:
            return dict(self._waiting)

    def done(self, rank):
        with self._lock:
            self._waiting.pop(rank, None)
            self._progress += 1

    def check(self, rank, op):
        with self._lock:
            live = self.size - len(self._exited)
            if len(self._waiting) < live:
                self._stalled = None
                return
            now = time.monotonic()
            if self._stalled is None or self._stalled[0] != self._progress:
                self._stalled = (self._progress, now)
                return
            if now - self._stalled[1] < STALL_S:
                return
            who = "; ".join(f"rank {r} waits for {w}" for r, w in sorted(self._waiting.items())[:8])
        raise HcclError("E_TIMEOUT", f"deadlock: every rank is waiting and none can proceed ({who})", rank=rank, op=op,
                        cause=Cause.TIMEOUT)


class Message(_MessageBase):
    """One posted send: a view of the sender's registered memory plus small metadata. It is
    both what the receiver takes and the sender's handle."""
    __slots__ = ("reply", "_done", "_watch")

    def __init__(self, src, dst, tag, data, meta, watch=None):
        super().__init__(src, dst, tag, data, meta)
        self.reply = None
        self._done = threading.Event()
        self._watch = watch

    def consumed(self, reply=None):
        """Called by the receiver once it no longer needs the sender's memory."""
        self.reply = reply
        self._done.set()
        if self._watch is not None:
            self._watch.done(self.src)      # the sender's wait is satisfied


class _Channel:
    __slots__ = ("cond", "queue")

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.queue = deque()


class InProcessTransport(Transport):
    """Zero-copy channels among `size` ranks living in one process."""

    plane = "threads"

    def __init__(self, size: int, timeout_s: float | None = None):
        self.size = size
        self.timeout_s = timeout_s
        self._channels = {}
        self._channels_lock = threading.Lock()
        self._registry = Registry()
        self._abort = AbortState()
        self._exited = set()
        self.watch = Watch(size)

    # registered memory -------------------------------------------------------------------
    def register(self, rank: int, name: str, array) -> None:
        self._registry.register(rank, name, array)

    def deregister(self, rank: int, name: str) -> None:
        self._registry.deregister(rank, name)

    def region(self, rank: int, name: str):
        return self._registry.region(rank, name)

    # abort -----------------------------------------------------------------------------------
    def abort(self, code: str, reason: str) -> None:
        self._abort.set(code, reason)
        self.abort_wake()

    def abort_scope(self, scope: str, code: str, reason: str, after=None) -> None:
        """Fail every wait on `scope`'s tags (base.scope_of) but its control rounds before `after`
        (base.AbortState); every rank shares this object."""
        self._abort.set_scope(scope, code, reason, after)
        self.abort_wake()

    def mark_exited(self, rank: int) -> None:
        """`rank` will post and consume nothing more: waits on it fail at once."""
        self._exited.add(rank)
        self.watch.exited(rank)
        self.abort_wake()

    def abort_wake(self):
        with self._channels_lock:
            channels = list(self._channels.values())
        for ch in channels:
            with ch.cond:
                ch.cond.notify_all()

    @property
    def aborted(self):
        return self._abort.aborted

    def close(self) -> None:
        """Nothing to release but the waiters: they are woken and fail."""
        self.abort("E_INTERNAL", "transport closed")

    def deadline(self):
        return None if not self.timeout_s else time.monotonic() + self.timeout_s

    def _channel(self, src, dst, tag):
        key = (src, dst, tag)
        ch = self._channels.get(key)
        if ch is None:
            with self._channels_lock:
                ch = self._channels.setdefault(key, _Channel())
        return ch

    # data plane --------------------------------------------------------------------------------
    def post(self, src: int, dst: int, tag, region: str, start: int, stop: int, meta=None) -> Message:
        """Expose region[start:stop] of `src`'s registered memory to `dst`."""
        view = self.region(src, region)[start:stop]
        return self.post_view(src, dst, tag, view, meta)

    def post_view(self, src: int, dst: int, tag, view, meta=None) -> Message:
        msg = Message(src, dst, tag, view, meta, self.watch)
        ch = self._channel(src, dst, tag)
        with ch.cond:
            ch.queue.append(msg)
            ch.cond.notify_all()
        self.watch.done(dst)                # whatever dst waits for may now be here: not stuck
        return msg

    def take(self, src: int, dst: int, tag, deadline=None, op: str | None = None) -> Message:
        """Wait for the next message from `src` to `dst` on `tag`."""
        ch = self._channel(src, dst, tag)
        with ch.cond:
            if ch.queue:
                return ch.queue.popleft()
            what = waiting_for_data(src, op)
            try:
                while not ch.queue:
                    self._abort.check(dst, op, tag)
                    self.watch.waiting(dst, what)
                    self.watch.check(dst, op)
                    if src in self._exited:
                        raise take_exited(src, dst, tag, op)
                    left = remaining(deadline)
                    if left is not None and left <= 0:
                        raise take_timeout(src, dst, self.timeout_s, op)
                    ch.cond.wait(_POLL_S if left is None else min(_POLL_S, left))
            finally:
                self.watch.done(dst)
            return ch.queue.popleft()

    def ready(self, src: int, dst: int, tag) -> bool:
        ch = self._channel(src, dst, tag)
        with ch.cond:
            return bool(ch.queue)

    def is_consumed(self, msg: Message) -> bool:
        return msg._done.is_set()

    def wait_consumed(self, msg: Message, deadline=None, op: str | None = None):
        """Wait until the receiver of `msg` has consumed it; returns its reply."""
        if msg._done.is_set():
            return msg.reply
        try:
            self._wait_consumed(msg, deadline, op)
        finally:
            self.watch.done(msg.src)
        return msg.reply

    def _wait_consumed(self, msg, deadline, op):
        while not msg._done.wait(_POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))):
            if msg._done.is_set():
                break
            self._abort.check(msg.src, op, msg.tag)
            self.watch.waiting(msg.src, waiting_for_consumer(msg.dst, op))
            self.watch.check(msg.src, op)
            exited = msg.dst in self._exited
            if msg._done.is_set():         # consumed since the first look (then, maybe, gone): done
                break
            if exited:
                raise consume_exited(msg.src, msg.dst, msg.tag, op)
            if deadline is not None and time.monotonic() >= deadline:
                raise consume_timeout(msg.src, msg.dst, self.timeout_s, op)
