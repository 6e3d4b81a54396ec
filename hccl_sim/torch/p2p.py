"""A hccl_sim ProcessGroup's sends and receives: torch's send / recv / isend / irecv (with tags,
and a receive from any source), on which batch_isend_irecv runs.

A send copies its tensor and posts the copy (Communicator.isend), and its Work completes at once,
as gloo's buffered send does: the tensor may be reused, and no receiver's progress waits on the
sender's worker. A receive starts a Communicator.irecv; its Work completes when the worker has
taken the data (hccl_sim.torch.work), knows its source rank (`_source_rank()`, which torch's
recv from any source reads), and fails with E_PARA when the data that arrives is not the
tensor's size and dtype. Each transfer's record (comm.last_op's form) joins the group's records
once it is complete.
"""
from __future__ import annotations

from topologies.errors import Cause, HcclError

from ..comm.p2p_calls import ANY_SOURCE
from .tensors import as_numpy
from .work import Deferred


class PointToPoint:
    """The point-to-point ops of ProcessGroupHcclSim (its collectives are on the group)."""

    def send(self, tensors, dstRank, tag=0):        # noqa: N803 - torch's names
        t = _one(tensors, "send")
        x = as_numpy(t).copy()

        def job():
            self._worker.settle(Deferred(self.comm.isend(x, dstRank, tag), self._p2p_done))
            return [t]
        return self._worker.submit(job)

    def recv(self, tensors, srcRank, tag=0):        # noqa: N803 - torch's names
        return self._receive(tensors, srcRank, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._receive(tensors, ANY_SOURCE, tag)

    def _receive(self, tensors, src, tag):
        t = _one(tensors, "recv")
        out = as_numpy(t)

        def finish(req):
            self._p2p_done(req)
            data = req.data
            if data.size != out.size or data.dtype != out.dtype:
                raise HcclError("E_PARA", f"recv from rank {req.source} (tag {tag}): {data.size} elements of "
                                f"{data.dtype} arrived for a tensor of {out.size} elements of {out.dtype}",
                                rank=self.comm.rank, op="recv", cause=Cause.BAD_INPUT)
            out.reshape(-1)[...] = data.reshape(-1)
            return [t]
        return self._worker.submit(lambda: Deferred(self.comm.irecv(src, tag), finish), receive=True)

    def _p2p_done(self, req):
        self.records.append(req.record)


def _one(tensors, op):
    if len(tensors) != 1:
        raise HcclError("E_PARA", f"{op} takes one tensor, got {len(tensors)}", cause=Cause.BAD_INPUT)
    return tensors[0]
