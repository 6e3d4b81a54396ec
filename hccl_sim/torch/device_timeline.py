"""A rank's simulated device timeline under torch: its compute priced kernel by kernel, its
communication on streams of its own, and what a training step spends on each.

Inside `with hccl_sim.torch.timeline() as tl:` every aten op this thread runs on real tensors
is a kernel on the rank's compute stream, priced on the device's roofline (launch + max(FLOPs /
peak, bytes / HBM bandwidth), `Device.model.kernel_ns`): FLOPs by torch's own counter
(torch.utils.flop_counter's registry: matmuls, convolutions, attention; CPU attention as torch
counts flash attention), bytes as the tensors the op reads and writes. Views, ops that touch no
data (factories of empty tensors, meta and fake tensors) and the collectives' own ops are not
kernels; a DTensor op is priced as the local ops it runs.

Communication runs as torch_npu's ProcessGroupHCCL runs it on an NPU (and c10d's NCCL group on
a GPU): each process group issues its collectives on a stream of its own, which waits at issue
for everything issued on the compute stream so far; sends and receives start at that same point
(each a transfer of its own, as torch's point-to-point streams are per peer). The compute stream
waits for an op's end where the program waits for it (Work.wait, wait_tensor) and, since a
correct program cannot read an op's output before that, where a kernel first reads a tensor a
collective or a receive wrote (a Future waited in C++, as DistributedDataParallel's are).

`mark()` starts a step, `since()` says what it took: its simulated time (from the mark to the
last of the compute and communication it issued), the compute stream's busy time, and the
exposed communication (the step's time the compute stream spent waiting). Simulated time only
depends on the program's order, never on the threads' timing.

Not modelled: contention between two groups' concurrent collectives (each is priced alone);
the 910B's peak FLOPs is a third-party figure, unverified (docs/references.md §3.2).
"""
from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from topologies.errors import Cause, HcclError

from ..npu.device import Event

def _shape(t):
    return tuple(t.shape)


def _cpu_attention_flops(args, backward):
    """torch counts flash attention's FLOPs; its CPU kernel's are the same."""
    if backward:
        grad_out, q, k, v = args[:4]
        return sdpa_backward_flop_count(_shape(grad_out), _shape(q), _shape(k), _shape(v))
    q, k, v = args[:3]
    return sdpa_flop_count(_shape(q), _shape(k), _shape(v))


_CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: False,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: True,
}
_HELD = 512                           # storages the timeline holds before it lets go of those freed
_NO_DATA = {torch.ops.aten.empty, torch.ops.aten.empty_strided, torch.ops.aten.empty_like, torch.ops.aten.new_empty,
            torch.ops.aten.new_empty_strided, torch.ops.aten.resize_, torch.ops.aten.set_}
_NOT_KERNELS = ("_c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor")


class SimEnd:
    """When an op issued on the timeline ends in simulated ns: set by the group's worker once the
    op has run (or failed), read by the thread that waits for it."""
    __slots__ = ("_ns", "_set", "_timeout_s")

    def __init__(self, timeout_s):
        self._ns, self._set, self._timeout_s = None, threading.Event(), timeout_s

    def set(self, ns: int) -> None:
        """The op's end (the first one told: a failure's fallback never overrides it)."""
        if self._ns is None:
            self._ns = int(ns)
        self._set.set()

    def get(self) -> int:
        if not self._set.wait(self._timeout_s):
            raise HcclError("E_TIMEOUT", f"an op this step issued did not end within {self._timeout_s:g} s "
                            "(the group's timeout, or HCCL_EXEC_TIMEOUT)", cause=Cause.TIMEOUT)
        return self._ns


class Step:
    """What one step took in simulated time, ns: `start` and `end` on the rank's timeline, `time`
    (the mark to the last of its compute and communication), `compute` (the time some kernel of
    it ran), `exposed` (the rest: the time the compute waited for communication, or communication
    ran past it), `kernels`, `flops`."""
    __slots__ = ("start", "end", "time", "compute", "exposed", "kernels", "flops")

    def __init__(self, start, end, compute, kernels, flops):
        self.start, self.end, self.compute, self.kernels, self.flops = start, end, compute, kernels, flops
        self.time = end - start
        self.exposed = self.time - compute

    def __repr__(self):
        return (f"<Step {self.time / 1e3:.1f} us: compute {self.compute / 1e3:.1f} us ({self.kernels} kernels, "
                f"{self.flops / 1e9:.3f} GFLOP), exposed communication {self.exposed / 1e3:.1f} us>")


class Timeline:
    """One rank's device timeline: its compute streams (the default one, and one for each torch
    CPU stream a program selects, as FSDP2 selects its copy-in and reduce-scatter streams), each
    group's comm stream, and when the tensors the ops wrote are ready. `world`: the process's
    hccl_sim.torch.World, where the timeline is the active one inside `with` (one rank per
    process, so at most one), which the groups read at issue."""

    def __init__(self, device, timeout_s, world):
        self.device = device
        self.world = world
        self.timeout_s = timeout_s
        self.compute = device.stream()
        self._side = {}                  # id(torch.cpu.Stream) -> (it, the device stream its kernels run on)
        self._comm = {}                  # id(process group) -> (group, its stream)
        # Keyed by storage address, each entry holding its storage: while it is held, the memory
        # cannot be handed to another tensor, so no entry ever speaks for a tensor it did not see
        # written (addresses freed by the groups' threads would be reused in wall-time order).
        self._ready = {}                 # data_ptr -> (when the kernel that last wrote it ends, storage)
        self._produced = {}              # data_ptr -> (SimEnd of the op that writes it, storage)
        self._issued = []                # SimEnds of this step's ops
        self._kernels = []               # (start, end) of this step's kernels
        self._mode = _Pricing(self)
        self._start, self._flops = 0, 0.0
        self.mark()

    # the program's side ----------------------------------------------------------------------------
    def _streams(self):
        return [self.compute] + [s for _, s in self._side.values()] + [s for _, s in self._comm.values()]

    def mark(self) -> None:
        """Start a step here: at the end of everything issued so far (a device synchronize)."""
        self._start = max([s.tail for s in self._streams()] + [e.get() for e in self._issued])
        for s in self._streams():
            s.wait_event(Event(self.device, self._start))
        self._issued, self._kernels, self._flops = [], [], 0.0
        self._release()

    def since(self) -> Step:
        """The step since `mark()`: it ends when the last op it issued does (each is waited for,
        within the group's timeout)."""
        end = max([self._start] + [s.tail for s in self._streams()] + [e.get() for e in self._issued])
        return Step(self._start, end, _covered(self._kernels), len(self._kernels), self._flops)

    def __enter__(self):
        if self.world.timeline is not None:
            raise HcclError("E_PARA", "a timeline is already active in this process (one rank, one timeline)",
                            cause=Cause.BAD_INPUT)
        self.world.timeline = self
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self.world.timeline = None
        return False

    def current(self):
        """The device stream of the torch CPU stream the program has selected (torch.cpu.stream)."""
        selected = torch.cpu.current_stream()
        if selected is self.world.default_cpu_stream:
            return self.compute
        entry = self._side.get(id(selected))
        if entry is None:
            entry = self._side[id(selected)] = (selected, self.device.stream())
        return entry[1]

    # the process group's side ----------------------------------------------------------------------
    def stream_of(self, pg):
        """The group's comm stream on this rank's device (made at its first op)."""
        entry = self._comm.get(id(pg))
        if entry is None:
            if pg.comm.device is not self.device:
                raise HcclError("E_PARA", "this process group's communicator is on another device than the "
                                "timeline's (a timeline is one rank's)", cause=Cause.BAD_INPUT)
            entry = self._comm[id(pg)] = (pg, self.device.stream())
        return entry[1]

    def issue(self, outputs, inputs=()) -> tuple:
        """An op issued now: when it may start (what was issued on the selected stream so far, and
        the writes of its inputs) and its SimEnd; `outputs` will be written by it."""
        after = max(self.current().tail, self._written([t for t in _tensors(inputs) if _real(t)]))
        sim = SimEnd(self.timeout_s)
        for t in _tensors(outputs):
            if _real(t):
                storage = t.untyped_storage()
                self._produced[storage.data_ptr()] = (sim, storage)
                self._ready.pop(storage.data_ptr(), None)
        self._issued.append(sim)
        return after, sim

    def join(self, sim: SimEnd) -> None:
        """The selected stream waits for an op (the program waited for it)."""
        self.current().wait_event(Event(self.device, sim.get()))

    def start(self, stream, after: int) -> None:
        """A comm stream waits for the point where its op was issued."""
        stream.wait_event(Event(self.device, after))

    def _written(self, tensors) -> int:
        """When the tensors are written: by kernels, and by the ops that produce them (which it
        waits for: a correct program waits for them before it reads them)."""
        ready = 0
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            produced = self._produced.pop(key, None)
            if produced is not None and produced[1].data_ptr() == key:
                self._ready[key] = (produced[0].get(), produced[1])
            entry = self._ready.get(key)
            if entry is None:
                continue
            if entry[1].data_ptr() != key:      # its storage was resized (FSDP2 frees that way): moved
                del self._ready[key]
            elif entry[0] > ready:
                ready = entry[0]
        return ready

    def _release(self) -> None:
        """Let go of the storages the program no longer holds (their entries can delay nothing)."""
        for table in (self._ready, self._produced):
            for key in [k for k, (_, st) in table.items() if torch._C._storage_Use_Count(st._cdata) == 1]:
                del table[key]

    # the pricing ------------------------------------------------------------------------------------
    def reads(self, args, kwargs) -> tuple:
        """Before an op runs: the tensors it reads, and when they are written (an op that writes
        one is waited for here, in wall time too: its data is there before the op reads it)."""
        tensors = [t for t in _tensors((args, kwargs)) if _real(t)]
        return tensors, self._written(tensors)

    def kernel(self, func, args, kwargs, out, tensors, ready) -> None:
        """After the op ran: it as a kernel on the selected stream, from when its inputs are ready."""
        packet = func._overloadpacket
        outs = [t for t in _tensors(out) if _real(t)]
        if packet in _NO_DATA or (not tensors and not any(t.numel() for t in outs)):
            return                            # memory handed out, not written: no kernel
        stream = self.current()
        stream.wait_event(Event(self.device, ready))
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **(kwargs or {}), out_val=out)
        elif packet in _CPU_ATTENTION:
            flops = _cpu_attention_flops(args, _CPU_ATTENTION[packet])
        else:
            flops = 0
        nbytes = sum(t.numel() * t.element_size() for t in tensors + outs)
        start, end = stream.compute(flops, nbytes, name=str(packet))
        if func._schema.is_mutable and args:       # an in-place op (its outputs may be none: _foreach_*_)
            outs = outs + [t for t in _tensors(args[0]) if _real(t)]
        for t in outs:
            storage = t.untyped_storage()
            self._ready[storage.data_ptr()] = (end, storage)
        self._kernels.append((start, end))
        self._flops += flops
        if len(self._ready) > _HELD:
            self._release()


def _covered(intervals) -> int:
    """The length of the union of (start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


class _Pricing(TorchDispatchMode):
    """The dispatch mode that prices each aten op of the timeline's thread."""

    def __init__(self, timeline):
        super().__init__()
        self.timeline = timeline

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types):
            if any(getattr(t, "__name__", "") == "DTensor" for t in types):
                return NotImplemented         # DTensor runs its local ops, which come back here
            return func(*args, **kwargs)      # fake and other subclasses' ops are not kernels
        if func.is_view or func.namespace in _NOT_KERNELS:
            return func(*args, **kwargs)
        tensors, ready = self.timeline.reads(args, kwargs)
        out = func(*args, **kwargs)
        self.timeline.kernel(func, args, kwargs, out, tensors, ready)
        return out


def _tensors(tree):
    """The tensors in nested lists, tuples and dicts."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _tensors(x)
    elif isinstance(tree, dict):
        for x in tree.values():
            yield from _tensors(x)


def _real(t) -> bool:
    """A tensor with data on the host (not meta, not sparse: their bytes are not a dense read)."""
    return t.layout == torch.strided and t.device.type == "cpu"


