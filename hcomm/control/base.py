"""The ControlPlane every control plane subclasses: the allgather of small payloads that every
rendezvous is, with abort, leave and close, each member declared here (optional ones with their
defaults), so an engine never asks which plane it holds.

Implementations: `shm_plane.ShmControl` (a shared-memory block of one host, `shm`), `nodes.NodeControl` (a
block per host, one leader per host across), `transport.TransportControl` (a dissemination
allgather over any peer transport), `mpi`'s per-rank view of one MPI Iallgather per process.
"""
from __future__ import annotations

import abc
from typing import Optional


class ControlPlane(abc.ABC):
    """One rank's control plane. `max_payload`: the largest payload an allgather carries."""

    max_payload: int

    @abc.abstractmethod
    def allgather(self, seq: int, payload: bytes, deadline: Optional[float], op: Optional[str] = None) -> list:
        """Every rank's payload of round `seq`, in rank order. Fails (an HcclError naming the rank
        that failed, returned or was lost, or E_TIMEOUT past `deadline`) on every waiting rank."""

    def allgather_records(self, seq: int, payload: bytes, layout, deadline: Optional[float], op: Optional[str] = None):
        """Round `seq` as `allgather` makes it, where this rank's payload is a record of `layout`
        (a struct.Struct in "<" order; payload = layout.pack(...)): (columns, None) when every
        rank's payload is as long as the record, one tuple per field of `layout` holding that field
        of every rank in rank order; else (None, the list `allgather` returns; a plane may return
        the list in the first case too). A loop repeating one call reads its round so, in one
        unpack; planes that can unpack the records where they land override this."""
        raws = self.allgather(seq, payload, deadline, op)
        joined = b"".join(raws)
        if len(joined) != layout.size * len(raws):
            return None, raws
        return tuple(zip(*layout.iter_unpack(joined))), None

    @abc.abstractmethod
    def abort(self, code: str, reason: str) -> None:
        """A rank failed: every pending and later round fails, here and at every peer, with
        HcclError(code, 'aborted: reason')."""

    def abort_for_communicator(self, code: str, reason: str) -> None:
        """comm.abort() of the communicator this plane serves: fail the rounds that the
        communicator's scoped abort of its transport (Transport.abort_scope) does not reach.
        Default: none, the plane's rounds travel on that transport."""

    def leave(self) -> None:
        """This rank's run returned: peers still waiting for it learn so at once. Default: the
        transport's goodbye tells them."""

    def close(self) -> None:
        """Release what this rank holds of the plane; idempotent. Default: nothing is held (the
        transport is closed by its owner)."""
