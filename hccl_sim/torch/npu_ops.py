"""The ops torch_npu's ProcessGroupHCCL adds to c10d's, on a hccl_sim group (docs/references.md §7.5).

torch_npu's Python calls them on the backend it gets from `group._get_backend(npu)`:
`torch_npu.distributed.reduce_scatter_tensor_uneven` and `all_gather_into_tensor_uneven` (HCCL's
ReduceScatterV and AllGatherV with split sizes along dim 0, equal splits when none are given),
its `batch_isend_irecv` (one HcclBatchSendRecv for the whole list, pairs with the rank itself
copied locally), and `get_hccl_comm_name`. Each makes torch_npu's checks first, in its words.
"""
from __future__ import annotations

from .checks import TorchNpuCheck, check_split_sizes
from .tensors import as_numpy

# torch_npu's op names: BatchSendRecv's item kind, and which side of the batch the tensor is on
_ITEM_KINDS = {"isend": ("send", 0), "irecv": ("recv", 1)}


class NpuOps:
    """ProcessGroupHcclSim's torch_npu-only ops (its other ops are c10d's)."""

    def reduce_scatter_tensor_uneven(self, output, input, input_split_sizes, opts=None):   # noqa: A002
        """HcclReduceScatterV: block j of `input` (input_split_sizes[j] rows, end to end) reduced
        over the ranks into rank j's `output`."""
        counts = self._uneven_counts(output, input, input_split_sizes, input)
        red = self._reduction(opts, input)

        def body():
            w = red.working(output)
            x = red.input(as_numpy(red.working(input)).reshape(-1))
            self._call(self.comm.reduce_scatter_v, x, counts, op=red.op, out=as_numpy(w).reshape(-1))
            self._then(None, lambda _: red.finish(output, w))
        return self._run(body, [output], [input])

    def all_gather_into_tensor_uneven(self, output, input, output_split_sizes, opts=None):   # noqa: A002
        """HcclAllGatherV: rank i's `input` (output_split_sizes[i] rows) at its place, end to end in
        rank order, in every rank's `output`."""
        counts = self._uneven_counts(output, input, output_split_sizes, output)

        def body():
            self._call(self.comm.all_gather_v, as_numpy(input).reshape(-1), counts, out=as_numpy(output).reshape(-1))
        return self._run(body, [output], [input])

    def _uneven_counts(self, output, input, split_sizes, split):   # noqa: A002
        """Elements per rank block of `split` (the tensor split along dim 0), after torch_npu's
        checks: both tensors dense on the group's device and contiguous, one dtype, split sizes
        (equal ones when none are given) that fit."""
        as_numpy(output), as_numpy(input)
        if input.dtype != output.dtype:
            raise TorchNpuCheck("output tensor must have the same type as input tensor", "PARAM")
        p = self.comm.size
        rows = split.shape[0] if split.dim() else 1
        sizes = list(split_sizes)
        check_split_sizes(sizes, rows, p)
        sizes = sizes or [rows // p] * p
        row = split.numel() // rows if rows else 1
        return [int(s) * row for s in sizes]

    def batch_isend_irecv(self, op_type, tensors, remote_rank_list):
        """torch_npu's batch_isend_irecv (its Python calls it for a list on npu tensors): one
        HcclBatchSendRecv of every "isend" / "irecv" with its peer; one Work for the batch."""
        if not (len(op_type) == len(tensors) == len(remote_rank_list)):
            raise TorchNpuCheck("op_type, tensors and remote_rank_list must have the same length", "PARAM")
        items, sides = [], ([], [])            # BatchSendRecv's items; the sent tensors, the received ones
        for name, t, peer in zip(op_type, tensors, remote_rank_list):
            kind = _ITEM_KINDS.get(name)
            if kind is None:
                raise TorchNpuCheck(f"Unsupported op type {name}: batch_isend_irecv takes isend and irecv",
                                    "NOT_SUPPORT")
            items.append((kind[0], int(peer), as_numpy(t)))
            sides[kind[1]].append(t)
        sent, receives = sides

        def body():      # BatchSendRecv takes no stream: under a timeline it is priced on the host's clock
            got = self.comm.batch_send_recv(items)
            self.records.append(self.comm.last_op)
            for t, arr in zip(receives, got):
                as_numpy(t).reshape(-1)[...] = arr.reshape(-1)
        return self._run(body, tensors, sent)

    def get_hccl_comm_name(self, rank=None, init_comm=True):
        """The name of the group's HCCL communicator (HcclGetCommName's), which torch_npu's
        profiler and users' tools key on: the group's torch name, as hccl-sim names no
        communicator otherwise (hccl_config's group_name, where torch_npu's Options gave one)."""
        return self._comm_name or self.getGroupName()
