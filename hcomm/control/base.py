"""The ControlPlane every control plane subclasses: the allgather of small payloads that every
rendezvous is, with abort, leave and close, each member declared here (optional ones with their
defaults), so an engine never asks which plane it holds.

Implementations: `shm.ShmControl` (a shared-memory block of one host), `nodes.NodeControl` (a
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
