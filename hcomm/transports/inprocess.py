"""In-process transport: registered memory and zero-copy, tagged, deadline-bounded channels.

Each rank registers named buffers; a send posts a reference to a slice of a registered buffer on
the (src, dst, tag) channel, and the receiver gets a numpy view of the sender's memory: no pickling
and no copy. The sender learns that its slice was consumed (and may overwrite it) through the
message's completion, HCCL's notify record/wait. Every wait has a deadline and is woken by an
abort, which turns a failure anywhere into an HcclError everywhere instead of a hang.

A waiting thread sleeps on a doorbell of its own, a raw lock it holds and the thread it waits for
releases: a post rings only the bells of its channel's receivers, a consume only its sender's, an
abort or a rank's exit every sleeping bell. Nothing is taken on the path that finds its message
there or its send consumed, so the hundreds of rank threads of a large job pass each other with no
lock in common (the GIL aside) and no thread is woken for another's message.
"""
from __future__ import annotations

import _thread
import itertools
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
    has not returned is waiting and nothing has progressed for STALL_S, every waiter raises.

    Every post, take and consume reports here, from hundreds of rank threads at once, so the
    reports take no lock: each is one dict store or pop and one `next` of a counter, each atomic
    under the GIL (a lock here was a convoy every rank queued on at every step). A report stores
    a progress value never stored before, so a later look sees that something moved even when
    reports land out of order. Only the rare look at an everyone-waits state takes the lock."""

    def __init__(self, size: int):
        self.size = size
        self._lock = threading.Lock()
        self._waiting = {}
        self._exited = set()
        self._ticks = itertools.count(1)
        self._progress = 0
        self._stalled = None          # (progress value, since) while everyone waits

    def progress(self):
        self._progress = next(self._ticks)

    def exited(self, rank):
        self._exited.add(rank)
        self._progress = next(self._ticks)

    def waiting(self, rank, what):
        self._waiting[rank] = what

    def waiting_ranks(self) -> dict:
        """rank -> what it waits for, of the ranks inside a wait now."""
        return dict(self._waiting)

    def done(self, rank):
        self._waiting.pop(rank, None)
        self._progress = next(self._ticks)

    def check(self, rank, op):
        if len(self._waiting) < self.size - len(self._exited):
            self._stalled = None
            return
        with self._lock:
            now, progress = time.monotonic(), self._progress
            stalled = self._stalled             # read once: a report may reset it meanwhile
            if stalled is None or stalled[0] != progress:
                self._stalled = (progress, now)
                return
            if now - stalled[1] < STALL_S:
                return
            who = "; ".join(f"rank {r} waits for {w}" for r, w in sorted(self.waiting_ranks().items())[:8])
        raise HcclError("E_TIMEOUT", f"deadlock: every rank is waiting and none can proceed ({who})", rank=rank, op=op,
                        cause=Cause.TIMEOUT)


def _new_bell():
    """A doorbell for one waiting thread: a raw lock, held, so that acquiring it sleeps until rung."""
    bell = _thread.allocate_lock()
    bell.acquire()
    return bell


def _ring(bell) -> None:
    """Wake the thread sleeping on `bell` (or let its next sleep return at once)."""
    try:
        bell.release()
    except RuntimeError:
        pass                        # rung already, and not slept on since: it will wake once


class Message(_MessageBase):
    """One posted send: a view of the sender's registered memory plus small metadata. It is
    both what the receiver takes and the sender's handle. `done` is set before `bell` is read,
    and the sender sets `bell` before it looks at `done` again: one of the two sees the other."""
    __slots__ = ("reply", "done", "bell", "_watch")

    def __init__(self, src, dst, tag, data, meta, watch=None):
        # the base's fields set here, not by its __init__: a large op posts tens of thousands
        self.src, self.dst, self.tag, self.data, self.meta = src, dst, tag, data, meta
        self.reply = None
        self.done = False
        self.bell = None            # the sender's doorbell while it waits for this consume
        self._watch = watch

    def consumed(self, reply=None):
        """Called by the receiver once it no longer needs the sender's memory."""
        self.reply = reply
        self.done = True
        bell = self.bell
        if bell is not None:
            _ring(bell)
        if self._watch is not None:
            self._watch.done(self.src)      # the sender's wait is satisfied


class InProcessTransport(Transport):
    """Zero-copy channels among `size` ranks living in one process."""

    plane = "threads"

    def __init__(self, size: int, timeout_s: float | None = None):
        self.size = size
        self.timeout_s = timeout_s
        # A channel is its (src, dst, tag): its messages in posting order, and the bells of the
        # threads waiting to take from it while there are any. One deque per channel, nothing
        # more: a 256-rank AlltoAll opens 65,280 of them, each one more object for every full
        # collection of Python's cycle collector to scan.
        self._queues = {}
        self._takers = {}
        self._channels_lock = threading.Lock()      # creates queues, changes takers
        self._sleeping = {}               # the bell of every thread inside a wait -> the rank it waits for
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
        # only the waits on `rank`: every rank's exit waking every waiter was ranks^2 wake-ups a job
        for bell, peer in tuple(self._sleeping.items()):
            if peer == rank:
                _ring(bell)

    def abort_wake(self):
        for bell in tuple(self._sleeping):
            _ring(bell)

    @property
    def aborted(self):
        return self._abort.aborted

    def close(self) -> None:
        """Nothing to release but the waiters: they are woken and fail."""
        self.abort("E_INTERNAL", "transport closed")

    def deadline(self):
        return None if not self.timeout_s else time.monotonic() + self.timeout_s

    def _queue(self, key) -> deque:
        queue = self._queues.get(key)
        if queue is None:
            with self._channels_lock:
                queue = self._queues.setdefault(key, deque())
        return queue

    # data plane --------------------------------------------------------------------------------
    def post(self, src: int, dst: int, tag, region: str, start: int, stop: int, meta=None) -> Message:
        """Expose region[start:stop] of `src`'s registered memory to `dst`."""
        return self.post_view(src, dst, tag, self._registry.region(src, region)[start:stop], meta)

    def post_view(self, src: int, dst: int, tag, view, meta=None) -> Message:
        msg = Message(src, dst, tag, view, meta, self.watch)
        key = (src, dst, tag)
        self._queue(key).append(msg)        # appended before the takers are read: see take
        for bell in self._takers.get(key, ()):
            _ring(bell)
        self.watch.done(dst)                # whatever dst waits for may now be here: not stuck
        return msg

    def take(self, src: int, dst: int, tag, deadline=None, op: str | None = None) -> Message:
        """Wait for the next message from `src` to `dst` on `tag`."""
        key = (src, dst, tag)
        queue = self._queue(key)
        try:
            return queue.popleft()
        except IndexError:
            pass
        bell = _new_bell()
        self._sleeping[bell] = src
        with self._channels_lock:           # before the queue is looked at again: no post is missed
            self._takers[key] = self._takers.get(key, ()) + (bell,)
        what = waiting_for_data(src, op)
        try:
            while True:
                try:
                    return queue.popleft()
                except IndexError:
                    pass
                self._abort.check(dst, op, tag)
                self.watch.waiting(dst, what)
                self.watch.check(dst, op)
                if src in self._exited and not queue:
                    raise take_exited(src, dst, tag, op)
                left = remaining(deadline)
                if left is not None and left <= 0:
                    raise take_timeout(src, dst, self.timeout_s, op)
                bell.acquire(True, _POLL_S if left is None else min(_POLL_S, left))
        finally:
            with self._channels_lock:
                others = tuple(b for b in self._takers.pop(key) if b is not bell)
                if others:
                    self._takers[key] = others
            self._sleeping.pop(bell, None)
            self.watch.done(dst)

    def ready(self, src: int, dst: int, tag) -> bool:
        return bool(self._queues.get((src, dst, tag)))

    def is_consumed(self, msg: Message) -> bool:
        return msg.done

    def wait_consumed(self, msg: Message, deadline=None, op: str | None = None):
        """Wait until the receiver of `msg` has consumed it; returns its reply."""
        if msg.done:
            return msg.reply
        bell = msg.bell = _new_bell()       # set before `done` is looked at again: see Message
        self._sleeping[bell] = msg.dst
        try:
            self._wait_consumed(msg, bell, deadline, op)
        finally:
            self._sleeping.pop(bell, None)
            self.watch.done(msg.src)
        return msg.reply

    def _wait_consumed(self, msg, bell, deadline, op):
        while not msg.done:
            self._abort.check(msg.src, op, msg.tag)
            self.watch.waiting(msg.src, waiting_for_consumer(msg.dst, op))
            self.watch.check(msg.src, op)
            exited = msg.dst in self._exited
            if msg.done:                    # consumed since the first look (then, maybe, gone): done
                break
            if exited:
                raise consume_exited(msg.src, msg.dst, msg.tag, op)
            left = remaining(deadline)
            if left is not None and left <= 0:
                raise consume_timeout(msg.src, msg.dst, self.timeout_s, op)
            bell.acquire(True, _POLL_S if left is None else min(_POLL_S, left))
