"""The simulated NPU each rank owns, and the runtime that manages it (an ACL-like lifecycle).

- HBM with the preset's capacity and a first-fit allocator (512-byte alignment, neighbours
  merged on free). Capacity is accounting: an allocation's bytes exist on the host only once
  its data is used, so a 64 GB device costs nothing until written. Running out is an HcclError
  (E_MEMORY) naming the request, what is free and the largest free block; `finalize` reports leaks.
  Under a fault plan's hbm_pressure another tenant holds some of what is free (`pressure`,
  hccl_sim.faults.hbm, read at the device's simulated clock): an allocation that fits only in
  what it holds fails with E_MEMORY naming its entry.
- Streams are ordered task queues on the rank's simulated timeline: a task starts when the
  stream's previous task has ended and the host has issued it, and lasts its modelled duration.
  Kernels follow a roofline (launch + max(flops / peak, bytes / HBM bandwidth)); host <-> device
  copies cross a PCIe model; device copies use HBM bandwidth.
- Events are recorded on one stream and waited on by another or by the host.
- The host has a clock of its own: issuing work is free, `synchronize` / `Work.wait` advance the
  host to the work's end. Collectives issued on a stream enter the communicator at the stream's
  time and leave their end on the stream, so compute on another stream overlaps them.
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from topologies.errors import Cause, HcclError

ALIGNMENT = 512
TASK_HISTORY = 4096                  # tasks a stream remembers for traces


class DeviceArray:
    """A block of HBM holding an array; `.data` is its contents (created on first use)."""
    __slots__ = ("device", "ptr", "nbytes", "shape", "dtype", "_data", "freed", "tag")

    def __init__(self, device, ptr, nbytes, shape, dtype, tag):
        self.device, self.ptr, self.nbytes, self.shape, self.dtype = device, ptr, nbytes, shape, dtype
        self._data, self.freed, self.tag = None, False, tag

    @property
    def data(self) -> np.ndarray:
        if self.freed:
            raise HcclError("E_PTR", f"use of freed device memory at 0x{self.ptr:x} ({self.tag})",
                            rank=self.device.rank)
        if self._data is None:
            self._data = self.device.storage(self.ptr, self.shape, self.dtype)
        return self._data

    def __repr__(self):
        return f"<DeviceArray {self.shape} {np.dtype(self.dtype).name} at 0x{self.ptr:x} on NPU {self.device.rank}>"


class Allocator:
    """First-fit allocation of [0, capacity) with merging of free neighbours."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._free = [(0, capacity)]          # sorted (start, size)
        self._used = {}                       # start -> size
        self.in_use = 0

    @staticmethod
    def rounded(nbytes: int) -> int:
        """What an allocation of `nbytes` takes: whole 512-byte blocks, at least one."""
        return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)

    def alloc(self, nbytes: int) -> int:
        size = self.rounded(nbytes)
        for i, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (start + size, length - size)
                self._used[start] = size
                self.in_use += size
                return start
        return -1

    def release(self, start: int) -> None:
        size = self._used.pop(start)
        self.in_use -= size
        i = bisect.bisect_left(self._free, (start, 0))
        self._free.insert(i, (start, size))
        # merge with the next and the previous block
        if i + 1 < len(self._free) and start + size == self._free[i + 1][0]:
            self._free[i] = (start, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.in_use

    @property
    def largest_free(self) -> int:
        return max((length for _, length in self._free), default=0)


@dataclass
class Event:
    """A point on a stream's timeline."""
    device: "Device"
    time: int | None = None

    def record(self, stream: "Stream") -> "Event":
        stream._check()
        self.time = stream.tail
        return self

    def synchronize(self) -> None:
        if self.time is None:
            raise HcclError("E_RUNTIME", "synchronize on an event that was never recorded", rank=self.device.rank)
        self.device.clock = max(self.device.clock, self.time)


@dataclass
class Stream:
    """An ordered queue of tasks on the device's simulated timeline."""
    device: "Device"
    id: int
    tail: int = 0                              # when the last issued task ends, ns
    # (name, start, end) of the latest tasks, for traces; bounded, so a long job does not grow it
    tasks: deque = field(default_factory=lambda: deque(maxlen=TASK_HISTORY))

    def _check(self):
        self.device._check_open()

    def enqueue(self, name: str, duration: int) -> tuple:
        """Append a task; returns its (start, end) in simulated ns."""
        self._check()
        start = max(self.tail, self.device.clock)
        end = start + int(duration)
        self.tail = end
        self.tasks.append((name, start, end))
        return start, end

    def compute(self, flops: float = 0.0, bytes: int = 0, name: str = "kernel") -> tuple:  # noqa: A002 - mirrors the contract
        """A kernel on the roofline of the device's compute model."""
        if flops < 0 or bytes < 0:
            raise HcclError("E_PARA", f"kernel {name}: flops and bytes must be >= 0", rank=self.device.rank)
        return self.enqueue(name, self.device.model.kernel_ns(flops, bytes))

    def record_event(self, event: Event | None = None) -> Event:
        return (event or Event(self.device)).record(self)

    def wait_event(self, event: Event) -> None:
        """Tasks issued on this stream after this call start no earlier than the event."""
        self._check()
        if event.time is None:
            raise HcclError("E_RUNTIME", "wait on an event that was never recorded", rank=self.device.rank)
        self.tail = max(self.tail, event.time)

    def synchronize(self) -> None:
        """The host waits for everything issued on this stream."""
        self._check()
        self.device.clock = max(self.device.clock, self.tail)


class Device:
    """One rank's NPU: HBM, streams, the host clock that issues work to it."""

    def __init__(self, rank: int, topo):
        self.rank = rank
        self.server = topo.server_of[rank]
        self.device_id = topo.device_of[rank]
        self.type = topo.device
        self.model = topo.device_model
        self.hbm_bytes = self.model.hbm_bytes
        self.allocator = Allocator(self.hbm_bytes)
        self.clock = 0                         # the host's simulated time, ns
        self.pressure = None                   # HBM another tenant holds (faults.hbm.HbmPressure), or None
        self._streams = []
        self._arrays = {}
        self._open = True
        self.default_stream = self.stream()
        # Where device memory's bytes live: storage(ptr, shape, dtype), zero-filled like np.zeros.
        # Host memory here; engines whose ranks share memory across processes put them in shared
        # memory so peers read them in place: a segment per array (Ray), or the array's own HBM
        # address `ptr` in the rank's region of an MPI shared window (the MPI window plane).
        self.storage = lambda ptr, shape, dtype: np.zeros(shape, dtype=dtype)

    def __repr__(self):
        return (f"<Device NPU {self.device_id} of server {self.server} ({self.type}), rank {self.rank}, "
                f"{self.allocator.in_use / 2**30:.2f}/{self.hbm_bytes / 2**30:.0f} GiB used>")

    def _check_open(self):
        if not self._open:
            raise HcclError("E_RUNTIME", "the runtime of this device has been finalised", rank=self.rank)

    # memory ------------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, tag: str = "user") -> DeviceArray:
        return self.empty((int(nbytes),), np.uint8, tag)

    def empty(self, shape, dtype=np.float32, tag: str = "user") -> DeviceArray:
        self._check_open()
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes < 0:
            raise HcclError("E_PARA", f"cannot allocate a negative size {nbytes}", rank=self.rank)
        a = self.allocator
        if self.pressure is not None:
            self._check_pressure(nbytes, tag)
        ptr = a.alloc(nbytes)
        if ptr < 0:
            raise HcclError("E_MEMORY", f"out of HBM: {tag} needs {_size(nbytes)}, {_size(a.free_bytes)} of "
                            f"{_size(a.capacity)} free, largest free block {_size(a.largest_free)}", rank=self.rank,
                            cause=Cause.NO_MEMORY)
        arr = DeviceArray(self, ptr, nbytes, shape, np.dtype(dtype), tag)
        self._arrays[ptr] = arr
        return arr

    def _check_pressure(self, nbytes: int, tag: str) -> None:
        """E_MEMORY naming the hbm_pressure entry when an allocation would fit in the free HBM but
        not beside what the entries held now (at the device's clock) take of it."""
        free = self.allocator.free_bytes
        held, label = self.pressure.holding(self.clock, free)
        size = Allocator.rounded(nbytes)
        if held and free - held < size <= free:
            raise HcclError("E_MEMORY", f"out of HBM at {self.clock / 1e9:.6f} s: {tag} needs {_size(size)}, "
                            f"{_size(free)} of {_size(self.allocator.capacity)} free, of which another tenant of the "
                            f"NPU holds {_size(held)} ({label})", rank=self.rank, time_ns=self.clock,
                            cause=Cause.NO_MEMORY, fault=label,
                            detail={"no_memory": True, "tag": tag, "nbytes": nbytes, "free_bytes": free,
                                    "held_bytes": held})

    def free(self, arr: DeviceArray) -> None:
        self._check_open()
        if not isinstance(arr, DeviceArray) or arr.device is not self:
            raise HcclError("E_PTR", "free of memory this device did not allocate", rank=self.rank)
        if arr.freed:
            raise HcclError("E_PTR", f"double free of device memory at 0x{arr.ptr:x} ({arr.tag})", rank=self.rank)
        self.allocator.release(arr.ptr)
        del self._arrays[arr.ptr]
        arr.freed, arr._data = True, None

    def leaks(self) -> list:
        return sorted(self._arrays.values(), key=lambda a: a.ptr)

    # streams, events, copies ------------------------------------------------------------------------
    def stream(self) -> Stream:
        self._check_open()
        s = Stream(self, len(self._streams), tail=self.clock)
        self._streams.append(s)
        return s

    def event(self) -> Event:
        return Event(self)

    def memcpy(self, dst, src, kind: str, stream: Stream | None = None) -> tuple:
        """Copy between host arrays and device arrays ("h2d", "d2h", "d2d") on a stream."""
        stream = stream or self.default_stream
        if kind not in ("h2d", "d2h", "d2d"):
            raise HcclError("E_PARA", f"memcpy kind {kind!r}: expected h2d, d2h or d2d", rank=self.rank)
        d = dst.data if isinstance(dst, DeviceArray) else dst
        s = src.data if isinstance(src, DeviceArray) else src
        if d.nbytes != s.nbytes:
            raise HcclError("E_PARA", f"memcpy {kind}: {s.nbytes} B into {d.nbytes} B", rank=self.rank)
        np.copyto(d.reshape(-1).view(np.uint8), np.ascontiguousarray(s).reshape(-1).view(np.uint8))
        if kind == "d2d":
            duration = self.model.copy_ns(s.nbytes)
        else:
            duration = self.model.pcie_ns(s.nbytes)
        return stream.enqueue(f"memcpy-{kind}", duration)

    def reset_timeline(self) -> None:
        """Start simulated time again at 0 (a new run on a device whose memory persists)."""
        self.clock = 0
        for s in self._streams:
            s.tail = 0
            s.tasks.clear()

    def synchronize(self) -> None:
        """The host waits for every stream of the device."""
        self._check_open()
        for s in self._streams:
            self.clock = max(self.clock, s.tail)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n} B"


class Work:
    """A collective issued on a stream: `wait()` makes the host wait for it and returns its result."""

    def __init__(self, result, stream: Stream, end: int, record):
        self.result, self.stream, self.end, self.record = result, stream, end, record

    def is_completed(self) -> bool:
        return self.stream.device.clock >= self.end

    def wait(self):
        dev = self.stream.device
        dev.clock = max(dev.clock, self.end)
        return self.result


class Runtime:
    """ACL-like lifecycle: init, set_device, (work), finalize. Misuse is an HcclError."""

    def __init__(self, rank: int, topo):
        self.rank, self.topo = rank, topo
        self.state = "created"
        self.device: Device | None = None

    def init(self) -> "Runtime":
        if self.state != "created":
            raise HcclError("E_RUNTIME", f"runtime init called twice (state {self.state})", rank=self.rank)
        self.state = "initialised"
        return self

    def set_device(self, device_id: int) -> Device:
        if self.state != "initialised":
            raise HcclError("E_RUNTIME", f"set_device before init or after finalize (state {self.state})",
                            rank=self.rank)
        expected = self.topo.device_of[self.rank]
        if device_id != expected:
            raise HcclError("E_PARA", f"set_device({device_id}): rank {self.rank} owns NPU {expected} of its server",
                            rank=self.rank)
        if self.device is None:
            self.device = Device(self.rank, self.topo)
        self.state = "ready"
        return self.device

    def finalize(self) -> list:
        """Release the device; returns the allocations never freed (the leak report)."""
        if self.state != "ready":
            raise HcclError("E_RUNTIME", f"finalize without a device set (state {self.state})", rank=self.rank)
        leaks = [a for a in self.device.leaks() if a.tag != "ccl-buffer"]
        self.device._open = False
        self.state = "finalised"
        return [(a.tag, a.nbytes, a.ptr) for a in leaks]



def storage_in_use(storage: list, runtimes: list) -> bool:
    """Whether user code may still reach the bytes of any of `storage` (device arrays' storage
    arrays an engine handed out, still alive), before the engine frees the memory under them: a
    storage array (or a view of it) referred to by more than its DeviceArray; a live DeviceArray
    with data referred to by more than its device; or such a device reachable by more than its own
    bookkeeping (a communicator, a runtime, a stream, an event user code holds). `runtimes` are the
    ranks' runtimes, held by the engine in one dict. Counts are sys.getrefcount's, less the
    references this function (and its caller's two lists) make."""
    import sys
    if not storage:
        return False
    ids = {id(a) for a in storage}
    owners = {}                      # id(storage) -> its live DeviceArray
    for rt in runtimes:
        dev = rt.device
        if dev is None:
            continue
        for da in dev._arrays.values():
            if da._data is not None and id(da._data) in ids:
                owners[id(da._data)] = da
    for a in storage:                # refs: `storage`, the loop variable, the argument, its DeviceArray
        if sys.getrefcount(a) > 3 + (id(a) in owners):
            return True
    if not owners:
        return False
    for da in owners.values():       # refs: the device's dict, `owners`, the loop variable, the argument
        if sys.getrefcount(da) > 4:
            return True
    for rt in runtimes:              # refs: the engine's dict of runtimes, `runtimes`, the loop variable, the argument
        dev = rt.device
        if sys.getrefcount(rt) > 4:
            return True
        if dev is None or not any(da.device is dev for da in owners.values()):
            continue
        for st in dev._streams:      # refs: the device's list (and default_stream), the loop variable, the argument
            if sys.getrefcount(st) > 3 + (st is dev.default_stream):
                return True
        # refs: the runtime, its streams, its arrays, the local variable, the argument
        if sys.getrefcount(dev) > 3 + len(dev._streams) + len(dev._arrays):
            return True
    return False
