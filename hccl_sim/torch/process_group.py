"""A torch.distributed ProcessGroup whose ops run on an hccl_sim Communicator.

Every op is a job on the group's worker (hccl_sim.torch.work) and returns a Work over a torch
Future that the worker completes with the output tensors, or fails with the HcclError, which
wait() raises. CPU tensors are viewed as numpy arrays (no copy) and the ops run in place where
torch's contract is in place (allreduce, broadcast). Each op runs as torch_npu's ProcessGroupHCCL
runs it on HCCL: gather as an AllGather (HCCL has no Gather), tensors of unequal sizes as the V
ops, coalesced ops as one op over the tensors end to end; sends and receives as the
Communicator's isend / irecv (hccl_sim.torch.p2p). The group carries the name and description
torch gives it (DeviceMesh, functional collectives and DTensor find groups by name). Every op's
simulated time is kept (`records`, and `last_op`), as `comm.last_op` says it.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from topologies.errors import HcclError

from .checks import TorchNpuCheck, check_split_sizes
from .grouping import Grouping
from .npu_ops import NpuOps
from .p2p import PointToPoint, SelfPairs
from .tensors import Reduction, as_numpy
from .work import Worker

BACKEND = "hccl_sim"


class ProcessGroupHcclSim(PointToPoint, NpuOps, Grouping, dist.ProcessGroup):
    def __init__(self, comm, world, on_shutdown=None, timeout=None):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.world = world                   # this process's hccl_sim.torch.World (its active timeline)
        self._on_shutdown = on_shutdown      # the world group's: close what the launch opened
        self.records = []            # comm.last_op of every op, in order of completion
        # torch's group timeout bounds every wait on the group's Works (DistBackendError past it)
        self._worker = Worker(f"{comm.rank}", world, None if timeout is None else timeout.total_seconds())
        self._name, self._desc = "", ""
        self._stream = None          # the comm stream of the job running now, under a timeline
        self._grouping = False       # whether the job running now is inside comm.group() (hccl_sim.torch.grouping)
        self._deferred = []          # inside it: (Pending, follow-up) to run once the group has launched
        self._held, self._held_depth = None, 0   # the ops held between _group_start and _group_end
        self.device_types = ("cpu",)  # the devices whose tensors the group's ops take
        self._backend_name, self._comm_name = BACKEND, None     # what serve_as changes
        self._self_pairs = SelfPairs()   # sends to this rank itself not yet received (hccl_sim.torch.p2p)

    def getBackendName(self):
        return self._backend_name

    def serve_as(self, backend: str, device_types: tuple, comm_name=None) -> None:
        """Be torch_npu's group: backend `backend` ("hccl") for `device_types` (npu), its
        communicator named `comm_name` (hccl_config's group_name; else the group's torch name)."""
        self._backend_name, self.device_types, self._comm_name = backend, device_types, comm_name

    # torch sets these on the groups it makes (c10d's ProcessGroup keeps them on its backends)
    def getGroupName(self):
        return self._name

    def setGroupName(self, name):
        self._name = name

    def getGroupDesc(self):
        return self._desc

    def setGroupDesc(self, desc):
        self._desc = desc

    def _get_sequence_number_for_group(self):
        """The ops this rank has issued on the group (torch's debug and logging read it)."""
        return self._worker.issued

    def _set_sequence_number_for_group(self):
        pass                             # counted from 0 on every rank alike: nothing to agree on

    @property
    def wait_timeout_s(self):
        """How long a wait for one of the group's ops may last: torch's group timeout, else
        HCCL_EXEC_TIMEOUT."""
        return self._worker.timeout_s if self._worker.timeout_s is not None else self.comm.wait_timeout

    def keep_until_waited(self, work):
        """Hold a Work of this group that is handed to C++ bare until it is waited (see
        Worker.keep_until_waited)."""
        return self._worker.keep_until_waited(work)

    @property
    def last_op(self):
        return self.records[-1] if self.records else None

    # helpers ----------------------------------------------------------------------------------------
    def _run(self, body, result, inputs=()):
        """Submit `body` (it runs the op's Communicator calls) as the group's job; its Work
        completes with `result`. Under a timeline (hccl_sim.torch.timeline) the op runs on the
        group's comm stream from the point it was issued at, and its Work knows when it ends."""
        self._check_devices(result, inputs)
        tl = self.world.timeline
        if tl is None:
            def job():
                body()
                return result
            return self._worker.submit(job) if self._held is None else self._hold(job)
        stream = tl.stream_of(self)
        after, sim = tl.issue(result, inputs or result)

        def timed_job():
            tl.start(stream, after)
            self._stream = stream
            try:
                body()
            finally:
                self._stream = None
                sim.set(stream.tail)
            return result
        work = self._worker.submit(timed_job)
        work.sim = sim
        return work

    def _call(self, method, *args, **kwargs):
        """A Communicator collective (on the group's comm stream while its job runs on a
        timeline), its OpRecord kept in the group's records (inside `_grouped`, the group's
        last op's, once it has launched)."""
        if self._stream is None:
            result = method(*args, **kwargs)
        else:
            result = method(*args, stream=self._stream, **kwargs)
            result = result if self._grouping else result.result
        if not self._grouping:
            self.records.append(self.comm.last_op)
        return result

    # the devices the group serves, as torch_npu's group has a backend registered for its device ----
    def serves(self, device) -> bool:
        return torch.device(device).type in self.device_types

    def _check_devices(self, *tensor_lists) -> None:
        """torch's refusal of a tensor whose device has no backend on the group (a CPU tensor on
        torch_npu's hccl group), before anything runs."""
        for t in _tensors(tensor_lists):
            if t.device.type not in self.device_types:
                raise RuntimeError(f"No backend type associated with device type {t.device.type}")

    def _get_backend(self, device):
        """The backend for `device`'s type: the group itself (torch_npu's is its ProcessGroupHCCL,
        on which scripts call get_hccl_comm_name and the like); torch's error for another type."""
        if not self.serves(device):
            raise RuntimeError(f"No backend type associated with device type {torch.device(device).type}")
        return self


    def _reduction(self, opts, tensor):
        return Reduction(opts, self.comm.size, tensor.dtype)

    def _all_reduce_into(self, t, red):
        if t.is_sparse:
            return self._sparse_all_reduce(t, red)
        w = red.working(t)
        x = red.input(as_numpy(w), in_place=True)
        self._call(self.comm.all_reduce, x, op=red.op, out=x)
        self._then(None, lambda _: red.finish(t, w))

    def _sparse_all_reduce(self, t, red):
        """A sparse COO tensor's SUM, as gloo makes it (HCCL has no sparse reduction): every rank's
        entry count (an AllGather), its indices and values (AllGatherVs), summed here."""
        if self._grouping:
            raise HcclError("E_NOT_SUPPORT", "a sparse tensor's all_reduce inside an HCCL group: its AllGatherVs "
                            "need the counts its AllGather finds first")
        if red.op != "sum" or red.factor is not None or red.divisor is not None:
            raise HcclError("E_NOT_SUPPORT", "a sparse tensor's all_reduce sums (ReduceOp.SUM) only")
        mine = t.coalesce()
        counts = self._call(self.comm.all_gather, np.array([mine._nnz()], np.int64))
        idx = self._call(self.comm.all_gather_v, np.ascontiguousarray(mine.indices().numpy().T), counts)
        vals = self._call(self.comm.all_gather_v, as_numpy(mine.values().contiguous()), counts)
        total = torch.sparse_coo_tensor(torch.from_numpy(np.ascontiguousarray(idx.T)), torch.from_numpy(vals),
                                        t.shape).coalesce()
        t.copy_(total)

    # collectives ------------------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        red = self._reduction(opts, tensors[0])
        return self._run(lambda: [self._all_reduce_into(t, red) for t in tensors], tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """One AllReduce over the tensors end to end (they share a dtype, as torch requires)."""
        red = self._reduction(opts, tensors[0] if tensors else torch.empty(0))

        def body():
            flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)
            self._all_reduce_into(flat, red)
            self._then(None, lambda _: [t.copy_(part.view_as(t)) for t, part in
                                        zip(tensors, flat.split([t.numel() for t in tensors]))])
        return self._run(body, tensors)

    def reduce(self, tensors, opts=None):
        """HcclReduce into the root's tensor; AVG as a SUM divided at the root."""
        root = opts.rootRank if opts is not None else 0
        red = self._reduction(opts, tensors[0])

        def body():
            for t in tensors:
                w = red.working(t)
                x = as_numpy(w)
                # red.input: a premultiplied copy, if any
                self._call(self.comm.reduce, red.input(x), root=root, op=red.op, out=x)
                if self.comm.rank == root:
                    self._then(None, lambda _, t=t, w=w: red.finish(t, w))
        return self._run(body, tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0

        def body():
            for t in tensors:
                x = as_numpy(t)
                self._call(self.comm.broadcast, x, root=root, out=x)
        return self._run(body, tensors)

    def allgather(self, output_lists, inputs, opts=None):
        """all_gather over lists of tensors: AllGather, or where the tensors differ in size
        HCCL's AllGatherV on their elements (as torch_npu's ProcessGroupHCCL does)."""
        def body():
            for outs, t in zip(output_lists, inputs):
                counts = [o.numel() for o in outs]
                if len(set(counts)) > 1:
                    y = self._call(self.comm.all_gather_v, as_numpy(t).reshape(-1), counts)
                    cut = lambda y, counts=counts: np.split(y, np.cumsum(counts)[:-1])  # noqa: E731
                else:
                    y = self._call(self.comm.all_gather, as_numpy(t).reshape(1, -1))
                    cut = lambda rows: rows  # noqa: E731
                self._then(y, lambda y, outs=outs, cut=cut: _copy_out(outs, cut(y)))
        return self._run(body, output_lists, inputs)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """One AllGather of the inputs end to end; output_lists[r][i] is rank r's inputs[i]."""
        def body():
            flat = np.concatenate([as_numpy(t).reshape(-1) for t in inputs]) if inputs else np.empty(0)
            rows = self._call(self.comm.all_gather, flat.reshape(1, -1))
            sizes = np.cumsum([t.numel() for t in inputs])[:-1]
            self._then(rows, lambda rows: [_copy_out(outs, np.split(row, sizes)) for outs, row in zip(output_lists, rows)])
        return self._run(body, output_lists, inputs)

    def gather(self, output_lists, inputs, opts=None):
        """dist.gather as torch_npu runs it on HCCL, which has no Gather: an AllGather, whose
        blocks the root keeps (torch's gather takes tensors of one size)."""
        root = opts.rootRank if opts is not None else 0

        def body():
            x = as_numpy(inputs[0]).reshape(1, -1)
            rows = self._call(self.comm.all_gather, x)
            if self.comm.rank == root:
                self._then(rows, lambda rows: _copy_out(output_lists[0], rows))
        return self._run(body, output_lists, inputs)

    def _allgather_base(self, output, input, opts=None):     # noqa: A002 - torch's name
        if input.dtype != output.dtype:               # torch_npu's checks, in its words
            raise TorchNpuCheck("output tensor must have the same type as input tensor", "PARAM")
        if input.numel() * self.comm.size != output.numel():
            raise TorchNpuCheck("output tensor size must be equal to world_size times input tensor size", "PARAM")

        def body():
            n = input.numel()
            out = as_numpy(output).reshape(self.comm.size, n)
            self._call(self.comm.all_gather, as_numpy(input).reshape(1, n), out=out)
        return self._run(body, [output], [input])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """One AllGather per pair, launched as one HCCL group (HcclGroupStart / End)."""
        def body():
            with self._grouped():
                for output, input_ in zip(outputs, inputs):
                    n = input_.numel()
                    self._call(self.comm.all_gather, as_numpy(input_).reshape(1, n),
                               out=as_numpy(output).reshape(self.comm.size, n))
        return self._run(body, outputs, inputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def _reduce_scatter_base(self, output, input, opts=None):    # noqa: A002 - torch's name
        if input.dtype != output.dtype:               # torch_npu's checks, in its words
            raise TorchNpuCheck("input tensor must be the same type as the output tensor.", "TYPE")
        if input.numel() != output.numel() * self.comm.size:
            raise TorchNpuCheck("input tensor must be the same size as output size times world size", "PARAM")
        return self.reduce_scatter_tensor_coalesced([output], [input], opts)

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """One ReduceScatter per pair, launched as one HCCL group (HcclGroupStart / End); a bool or
        uint8 pair reduced as int32, AVG divided once the group has ended."""
        red = self._reduction(opts, inputs[0] if inputs else torch.empty(0))

        def body():
            with self._grouped():
                for output, input_ in zip(outputs, inputs):
                    n = output.numel()
                    w = red.working(output)
                    x = red.input(as_numpy(red.working(input_)).reshape(self.comm.size * n))
                    self._call(self.comm.reduce_scatter, x, op=red.op, out=as_numpy(w).reshape(n))
                    self._then(None, lambda _, output=output, w=w: red.finish(output, w))
        return self._run(body, outputs, inputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        red = self._reduction(opts, outputs[0])

        def body():
            for out, ins in zip(outputs, input_lists):
                x = red.input(np.concatenate([as_numpy(red.working(t)).reshape(-1) for t in ins]), in_place=True)
                w = red.working(out)                          # x is a copy; w is out, or its int32 copy
                y = as_numpy(w).reshape(-1)
                counts = [t.numel() for t in ins]
                if len(set(counts)) > 1:        # tensors of different sizes: HCCL's ReduceScatterV
                    self._call(self.comm.reduce_scatter_v, x, counts, op=red.op, out=y)
                else:
                    self._call(self.comm.reduce_scatter, x, op=red.op, out=y)
                self._then(None, lambda _, out=out, w=w: red.finish(out, w))
        return self._run(body, outputs, input_lists)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """dist.scatter: HCCL's Scatter of the root's list (equal tensors) into each rank's output."""
        root = opts.rootRank if opts is not None else 0

        def body():
            out = output_tensors[0]
            n = out.numel()
            if self.comm.rank == root:
                x = np.concatenate([as_numpy(t).reshape(-1) for t in input_tensors[0]])
            else:                                   # the shape and dtype; the root's data is scattered
                x = np.zeros(n * self.comm.size, dtype=as_numpy(out).dtype)
            self._call(self.comm.scatter, x.reshape(self.comm.size, n), root=root, out=as_numpy(out).reshape(1, n))
        return self._run(body, output_tensors, input_tensors)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):   # noqa: A002
        """all_to_all_single: equal splits run AlltoAll; split sizes (rows along dim 0, either side
        may be left empty for equal rows) run HCCL's AlltoAllV."""
        p = self.comm.size
        check_split_sizes(output_split_sizes, _rows(as_numpy(output)).shape[0], p)
        check_split_sizes(input_split_sizes, _rows(as_numpy(input)).shape[0], p)
        if not output_split_sizes and not input_split_sizes:
            def body():
                x = as_numpy(input).reshape(p, -1)
                self._call(self.comm.all_to_all, x, out=as_numpy(output).reshape(p, -1))
            return self._run(body, [output], [input])

        def body_v():
            x = _rows(as_numpy(input))
            out = _rows(as_numpy(output))
            send = list(input_split_sizes) or [x.shape[0] // p] * p
            recv = list(output_split_sizes) or [out.shape[0] // p] * p
            self._call(self.comm.all_to_all_v, x, send, recv, out=out)
        return self._run(body_v, [output], [input])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all over lists of tensors, any sizes: HCCL's AlltoAllV on their elements."""
        def body():
            x = np.concatenate([as_numpy(t).reshape(-1) for t in input_tensors]) if input_tensors else np.empty(0)
            recv = [t.numel() for t in output_tensors]
            y = self._call(self.comm.all_to_all_v, x, [t.numel() for t in input_tensors], recv)
            self._then(y, lambda y: _copy_out(output_tensors, np.split(y, np.cumsum(recv)[:-1])))
        return self._run(body, output_tensors, input_tensors)

    def barrier(self, opts=None):
        def body():
            self._call(self.comm.barrier)
        return self._run(body, [])

    def shutdown(self):
        """torch's destroy_process_group calls it for every group it destroys (ops held by an open
        _group_start fail: they will never launch)."""
        held, self._held = self._held or [], None
        for _, fut in held:
            self._worker.complete(fut, error=HcclError("E_PARA", "the process group was destroyed between "
                                                       "_group_start and _group_end: the held op never launched"))
        self._worker.stop()
        done, self._on_shutdown = self._on_shutdown, None
        if done is not None:
            done()


def _tensors(nested):
    """The tensors in nested lists (an op's inputs and outputs)."""
    for item in nested:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from _tensors(item)


def _copy_out(tensors, parts) -> None:
    """Each tensor gets its part's elements (a gathered or exchanged result cut into tensors)."""
    for t, part in zip(tensors, parts):
        as_numpy(t).reshape(-1)[...] = np.asarray(part).reshape(-1)


def _rows(a: np.ndarray) -> np.ndarray:
    """`a` as rows along its first dimension (a 0-d array as one row): a row is a[0]'s elements,
    however many rows there are (none too)."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    return a.reshape(a.shape[0], int(np.prod(a.shape[1:], dtype=np.int64)))
