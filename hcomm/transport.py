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

from topologies.errors import HcclError

_POLL_S = 0.05   # how often a waiter re-checks abort; wake-ups on progress are immediate


class Message:
    """One posted send: a view of the sender's registered memory plus small metadata."""
    __slots__ = ("src", "dst", "tag", "data", "meta", "reply", "_done")

    def __init__(self, src, dst, tag, data, meta):
        self.src, self.dst, self.tag, self.data, self.meta = src, dst, tag, data, meta
        self.reply = None
        self._done = threading.Event()

    def consumed(self, reply=None):
        """Called by the receiver once it no longer needs the sender's memory."""
        self.reply = reply
        self._done.set()


class _Channel:
    __slots__ = ("cond", "queue")

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.queue = deque()


class InProcessTransport:
    """Zero-copy channels among `size` ranks living in one process."""

    def __init__(self, size: int, timeout_s: float | None = None):
        self.size = size
        self.timeout_s = timeout_s
        self._channels = {}
        self._channels_lock = threading.Lock()
        self._registered = [dict() for _ in range(size)]
        self._abort = None   # (code, reason) once aborted
        self._exited = set()

    # registered memory -------------------------------------------------------------------
    def register(self, rank: int, name: str, array) -> None:
        self._registered[rank][name] = array

    def deregister(self, rank: int, name: str) -> None:
        self._registered[rank].pop(name, None)

    def region(self, rank: int, name: str):
        try:
            return self._registered[rank][name]
        except KeyError:
            raise HcclError("E_PTR", f"buffer {name!r} is not registered", rank=rank)

    # abort -----------------------------------------------------------------------------------
    def abort(self, code: str, reason: str) -> None:
        if self._abort is None:
            self._abort = (code, reason)
        self.abort_wake()

    def mark_exited(self, rank: int) -> None:
        """`rank` will post and consume nothing more: waits on it fail at once."""
        self._exited.add(rank)
        self.abort_wake()

    def abort_wake(self):
        with self._channels_lock:
            channels = list(self._channels.values())
        for ch in channels:
            with ch.cond:
                ch.cond.notify_all()

    @property
    def aborted(self):
        return self._abort

    def _check_abort(self, rank, op):
        if self._abort is not None:
            code, reason = self._abort
            raise HcclError(code, f"aborted: {reason}", rank=rank, op=op)

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
        msg = Message(src, dst, tag, view, meta)
        ch = self._channel(src, dst, tag)
        with ch.cond:
            ch.queue.append(msg)
            ch.cond.notify_all()
        return msg

    def take(self, src: int, dst: int, tag, deadline=None, op: str | None = None) -> Message:
        """Wait for the next message from `src` to `dst` on `tag`."""
        ch = self._channel(src, dst, tag)
        with ch.cond:
            while not ch.queue:
                self._check_abort(dst, op)
                if src in self._exited:
                    raise HcclError("E_PARA", f"rank {src} returned without sending what this rank waits for "
                                    f"(tag {tag!r})", rank=dst, op=op)
                remaining = _remaining(deadline)
                if remaining is not None and remaining <= 0:
                    raise HcclError("E_TIMEOUT", f"no data from rank {src} within {self.timeout_s:g} s "
                                    "(HCCL_EXEC_TIMEOUT)", rank=dst, op=op)
                ch.cond.wait(_POLL_S if remaining is None else min(_POLL_S, remaining))
            return ch.queue.popleft()

    def wait_consumed(self, msg: Message, deadline=None, op: str | None = None):
        """Wait until the receiver of `msg` has consumed it; returns its reply."""
        while not msg._done.wait(_POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))):
            if msg._done.is_set():
                break
            self._check_abort(msg.src, op)
            if msg.dst in self._exited:
                raise HcclError("E_PARA", f"rank {msg.dst} returned without receiving what this rank sent "
                                f"(tag {msg.tag!r})", rank=msg.src, op=op)
            if deadline is not None and time.monotonic() >= deadline:
                raise HcclError("E_TIMEOUT", f"rank {msg.dst} did not consume the data sent to it within "
                                f"{self.timeout_s:g} s (HCCL_EXEC_TIMEOUT)", rank=msg.src, op=op)
        return msg.reply


def _remaining(deadline):
    return None if deadline is None else deadline - time.monotonic()
