"""One rank's view of the trainer's collectives and device timeline.

Compute kernels go on the device's compute (default) stream, charged on its roofline; gradient
buckets are all-reduced on a communication stream of their own, each entering at the compute
stream's time when it was launched (an event recorded there, waited on by the comm stream), so
they overlap the rest of backward; SyncBatchNorm's AllReduces run in order on the compute stream
(the next kernel needs their result). It counts what the step spent in each.

`Sync(None)` is the single-process reference: every collective is the identity and nothing is
timed, so the same training code computes the full-batch result that data-parallel training
must equal.
"""
from __future__ import annotations


class Sync:
    def __init__(self, comm, algo: str | None = None):
        self.comm, self.algo = comm, algo
        if comm is not None:
            dev = comm.device
            self.compute = dev.default_stream
            self.comm_stream = dev.stream()
        self.new_step()

    @property
    def size(self) -> int:
        return 1 if self.comm is None else self.comm.size

    def new_step(self):
        self.compute_ns = self.comm_ns = self.retries = 0
        self.ops = []                # (name, start, end) of every collective of the step
        self.algos = set()           # what ran them (last_op.algo)

    def rebind(self, comm):
        """After a shrink: the same device and streams, the survivors' communicator."""
        self.comm = comm

    # time -------------------------------------------------------------------------------------------
    def now(self) -> int:
        """When everything issued so far has ended (the host waits for both streams)."""
        if self.comm is None:
            return 0
        dev = self.comm.device
        dev.clock = max(dev.clock, self.compute.tail, self.comm_stream.tail)
        return dev.clock

    def compute_time(self) -> int:
        return 0 if self.comm is None else self.compute.tail

    def kernel(self, name: str, flops: float, nbytes: int) -> None:
        if self.comm is not None:
            start, end = self.compute.compute(flops, nbytes, name)
            self.compute_ns += end - start

    def host_copy(self, name: str, nbytes: int) -> None:
        """A device -> host copy on the compute stream (a checkpoint)."""
        if self.comm is not None:
            dev = self.comm.device
            start, end = self.compute.enqueue(name, dev.model.pcie_ns(nbytes))
            self.compute_ns += end - start

    # collectives ------------------------------------------------------------------------------------
    def _count(self, name, record):
        self.comm_ns += record.end - record.start
        self.retries += record.retries
        self.ops.append((name, record.start, record.end))
        self.algos.add(record.algo)

    def all_reduce(self, x, name: str):
        """The sum over ranks, in order on the compute stream."""
        if self.comm is None:
            return x
        work = self.comm.all_reduce(x, algo=self.algo, stream=self.compute)
        self._count(name, work.record)
        return work.result

    def all_reduce_async(self, x, name: str):
        """The sum over ranks on the comm stream, from the compute stream's present time."""
        if self.comm is None:
            return x
        self.comm_stream.wait_event(self.compute.record_event())
        work = self.comm.all_reduce(x, algo=self.algo, stream=self.comm_stream)
        self._count(name, work.record)
        return work, self.comm_stream.record_event()

    def wait(self, pending):
        """The result of all_reduce_async; the compute stream's later kernels wait for it (the
        optimizer step needs every bucket), the host does not."""
        if self.comm is None:
            return pending
        work, done = pending
        self.compute.wait_event(done)
        return work.result
