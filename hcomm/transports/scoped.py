"""A sub-communicator's view of its parent's transport: some ranks, renumbered, traffic apart.

Ranks that share no memory (Ray actors, MPI processes) already hold one connected transport per
job; a communicator made by split or shrink reuses it instead of connecting again, as NCCL's
ncclCommSplit may share its parent's resources (docs/references.md §8.3). The view
numbers the members 0..k-1 (rank i is the parent's rank members[i]), wraps every tag as
(SCOPED, scope, tag) and every buffer name as "scope/name", so two communicators' messages and
registered buffers never meet. `abort` is the communicator's own (base.AbortState scopes): it
fails the waits on this scope's tags here and at every peer, and leaves the parent and other
sub-communicators working.
"""
from __future__ import annotations

from .base import SCOPED, Transport


class ScopedTransport(Transport):
    """A Transport over `parent` for the ranks `members` of it."""

    host_steps = None       # the parent's step words are its world communicator's (hcomm.transports.host_steps)

    def __init__(self, parent, members, scope: str):
        if isinstance(parent, ScopedTransport):         # nested: one scope level over the root
            members = [parent.members[m] for m in members]
            parent = parent.parent
        self.parent, self.members, self.scope = parent, tuple(members), scope
        self.size = len(self.members)
        self.timeout_s = parent.timeout_s
        self.plane = parent.plane

    def _tag(self, tag):
        return (SCOPED, self.scope, tag)

    def _name(self, name: str) -> str:
        return f"{self.scope}/{name}"

    def register(self, rank, name, array):
        self.parent.register(self.members[rank], self._name(name), array)

    def deregister(self, rank, name):
        self.parent.deregister(self.members[rank], self._name(name))

    def region(self, rank, name):
        return self.parent.region(self.members[rank], self._name(name))

    def post(self, src, dst, tag, region, start, stop, meta=None):
        return self.parent.post(self.members[src], self.members[dst], self._tag(tag), self._name(region), start,
                                stop, meta)

    def post_view(self, src, dst, tag, view, meta=None):
        return self.parent.post_view(self.members[src], self.members[dst], self._tag(tag), view, meta)

    def take(self, src, dst, tag, deadline=None, op=None):
        return self.parent.take(self.members[src], self.members[dst], self._tag(tag), deadline, op)

    def wait_consumed(self, handle, deadline=None, op=None):
        return self.parent.wait_consumed(handle, deadline, op)

    def ready(self, src, dst, tag):
        return self.parent.ready(self.members[src], self.members[dst], self._tag(tag))

    def is_consumed(self, handle):
        return self.parent.is_consumed(handle)

    def deadline(self):
        return self.parent.deadline()

    def abort(self, code: str, reason: str) -> None:
        """This communicator's abort: its waits fail, here and at its peers; the parent's go on."""
        self.parent.abort_scope(self.scope, code, reason)

    def abort_scope(self, scope: str, code: str, reason: str, after=None) -> None:
        self.parent.abort_scope(scope, code, reason, after)

    def watch_peer(self, peer: int) -> None:
        self.parent.watch_peer(self.members[peer])

    def unwatch_peer(self, peer: int) -> None:
        self.parent.unwatch_peer(self.members[peer])

    def lost(self, peer: int):
        return self.parent.lost(self.members[peer])

    def world_rank(self, rank: int) -> int:
        return self.parent.world_rank(self.members[rank])

    def mark_exited(self, rank: int) -> None:
        pass            # a rank leaves the job, not one communicator: the parent transport is told

    def close(self) -> None:
        pass            # the parent transport belongs to the run that opened it
