"""What a rank is waiting for, so a driver can tell a deadlock from a slow rank.

Ranks that are processes (Ray actors) live apart, possibly on separate hosts, so no one of them
sees every wait. Each rank records what it waits for and counts the waits it completes; the
driver polls every rank and, when every rank that has not returned is waiting
and no count has moved for STALL_S, tells each one (E_TIMEOUT, "deadlock: ..."), as the local
in-process transport's watch does.
"""
from __future__ import annotations

from .base import Transport
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
        """(what the rank waits for, or None; how many waits it finished). A collective's control
        round says what it waits for as (op, seq): formatted here, not on every round."""
        what = self.what
        if isinstance(what, tuple):
            what = f"{what[0]} (collective #{what[1]})"
        return what, self.progress


class WatchedTransport(Transport):
    """A transport whose blocking waits are recorded in a RankWatch; every other member is the
    wrapped transport's."""

    def __init__(self, transport: Transport, watch: RankWatch):
        self._tr, self._watch = transport, watch
        self.size, self.timeout_s, self.plane = transport.size, transport.timeout_s, transport.plane

    @property
    def host_steps(self):
        return self._tr.host_steps

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

    # ---- passed through ----------------------------------------------------------------------------
    def register(self, rank, name, array):
        self._tr.register(rank, name, array)

    def deregister(self, rank, name):
        self._tr.deregister(rank, name)

    def region(self, rank, name):
        return self._tr.region(rank, name)

    def post(self, src, dst, tag, region, start, stop, meta=None):
        return self._tr.post(src, dst, tag, region, start, stop, meta)

    def post_view(self, src, dst, tag, view, meta=None):
        return self._tr.post_view(src, dst, tag, view, meta)

    def ready(self, src, dst, tag):
        return self._tr.ready(src, dst, tag)

    def is_consumed(self, handle):
        return self._tr.is_consumed(handle)

    def deadline(self):
        return self._tr.deadline()

    def abort(self, code, reason):
        self._tr.abort(code, reason)

    def abort_scope(self, scope, code, reason, after=None):
        self._tr.abort_scope(scope, code, reason, after)

    def mark_exited(self, rank):
        self._tr.mark_exited(rank)

    def watch_peer(self, peer):
        self._tr.watch_peer(peer)

    def unwatch_peer(self, peer):
        self._tr.unwatch_peer(peer)

    def lost(self, peer):
        return self._tr.lost(peer)

    def world_rank(self, rank):
        return self._tr.world_rank(rank)

    def share_host(self, memory, ranks):
        self._tr.share_host(memory, ranks)

    def close(self):
        self._tr.close()
