"""MPI transport: each rank's endpoint (a PeerEndpoint) over its process's `MpiHub`
(hcomm.transports.mpi.hub), which owns the job's duplicate communicator, moves frames and payloads with
mpi4py's buffer calls, drives progress while a rank waits and runs the control allgather. The
endpoint hands its sends, acknowledgements and waits to the hub.
"""
from __future__ import annotations

from topologies.errors import HcclError

from ..peer import PeerEndpoint
from .hub import ACK, BYE, DATA, MpiHub

__all__ = ["MpiTransport"]


class MpiTransport(PeerEndpoint):
    """One rank's endpoint over its process's hub (PeerEndpoint semantics; see the module docstring)."""

    plane = "p2p"

    def __init__(self, hub: MpiHub, rank: int):
        super().__init__(rank, hub.size, hub.timeout_s)
        if rank not in hub.local_ranks():
            raise HcclError("E_PARA", f"rank {rank} is not hosted by MPI process {hub.proc}", rank=rank)
        self._hub = hub
        hub.endpoints[rank] = self

    def _send_data(self, handle, view, meta) -> None:
        if view.dtype.hasobject or view.dtype.fields is not None:
            raise HcclError("E_PARA", f"the MPI transport moves plain numeric arrays, not dtype {view.dtype}",
                            rank=self.rank)
        handle.keep = view           # Isend reads it until the request completes
        self._hub.send(DATA, self.rank, handle.dst, handle.id,
                       {"tag": handle.tag, "dtype": view.dtype.str, "shape": view.shape, "meta": meta}, view)

    def _send_ack(self, src, msg_id, reply) -> None:
        self._hub.send(ACK, self.rank, src, msg_id, {"reply": reply})

    def _announce_exit(self) -> None:
        for q in range(self.size):
            if q != self.rank:
                self._hub.send(BYE, self.rank, q, -1, {})

    def _idle(self, timeout: float, for_acks: bool = False, ready=None) -> None:
        self.cond.release()         # the hub delivers into this endpoint under its lock
        try:
            self._hub.idle(timeout)
        finally:
            self.cond.acquire()

    def _release(self, data) -> None:
        self._hub.release(data)

    def close(self) -> None:
        self.abort("E_INTERNAL", f"rank {self.rank}'s MPI transport was closed")
