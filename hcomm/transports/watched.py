"""What a rank is waiting for, so a driver can tell a deadlock from a slow rank.

Ranks that are processes (Ray actors) live apart, possibly on separate hosts, so no one of them
sees every wait. Each rank records what it waits for and counts the waits it completes; the
driver polls every rank and, when every rank that has not returned is waiting
and no count has moved for STALL_S, tells each one (E_TIMEOUT, "deadlock: ..."), as the local
in-process transport's watch does.
"""
from __future__ import annotations

from .inprocess import STALL_S

__all__ = ["RankWatch", "WatchedTransport", "STALL_S"]


class RankWatch:
    """`with watch.waiting(what):` around every blocking wait. Two attribute stores, no lock: the
    driver's poll (another thread) reads them and at worst sees a wait a moment late, which only
    delays a deadlock verdict by one poll (the verdict needs STALL_S without progress anyway)."""

    def __init__(self):
        self.what = None
        self.progress = 0

    def waiting(self, what: str) -> "RankWatch":
        self.what = what
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.what = None
        self.progress += 1
        return False

    def snapshot(self):
        return self.what, self.progress


class WatchedTransport:
    """A transport whose blocking waits are recorded in a RankWatch (everything else passes through)."""

    def __init__(self, transport, watch: RankWatch):
        self._tr, self._watch = transport, watch

    def __getattr__(self, name):
        return getattr(self._tr, name)

    def take(self, src, dst, tag, deadline=None, op=None):
        with self._watch.waiting(f"data from rank {src}" + (f" ({op})" if op else "")):
            return self._tr.take(src, dst, tag, deadline, op)

    def wait_consumed(self, handle, deadline=None, op=None):
        with self._watch.waiting(f"rank {handle.dst} to take its data" + (f" ({op})" if op else "")):
            return self._tr.wait_consumed(handle, deadline, op)

    def wait_for(self, peer, ready, deadline=None, op=None, for_acks=False, tag=None):
        what = f"rank {peer} to take its data" if for_acks else f"data from rank {peer}"
        with self._watch.waiting(what + (f" ({op})" if op else "")):
            return self._tr.wait_for(peer, ready, deadline, op, for_acks, tag)
