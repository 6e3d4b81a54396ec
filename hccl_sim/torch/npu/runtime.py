"""`torch.npu` (the same module object is `torch_npu.npu`): the emulated NPUs' runtime API, as
torch_npu's (docs/references.md §7.6).

Devices: `device_count`, `set_device`, `current_device`, `device` (a context), `is_available`,
`synchronize`, `get_device_name`. Streams and events are the simulated Device's
(hccl_sim.npu.device): `Stream` a device stream of the card's Device, `Event` a point recorded on
one (`elapsed_time` in ms between two of them from the device's simulated clocks; ops computed on
the host put no tasks on these streams, so only what runs on a stream in simulated time, such as a
collective, moves them), `current_stream`, `default_stream`, `set_stream`, `stream(s)`. Memory:
what memory.py charges (`memory_allocated` and its peak; `memory_reserved` is the same, nothing is
cached; `mem_get_info` the Device's free and total HBM). Random numbers: each card's generator
(dispatch.generator), which `torch.manual_seed` seeds too. Any other name is not emulated: an
HcclError (E_NOT_SUPPORT) that is also an AttributeError, so torch's own probes of the module
(`hasattr`) still work.
"""
from __future__ import annotations

import torch

from topologies.errors import HcclError

from . import devices, dispatch, memory
from .errors import NotEmulated

OutOfMemoryError = torch.OutOfMemoryError      # what torch_npu raises (a torch.OutOfMemoryError)


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    """torch_npu's explicit init: nothing to start here."""


def _lazy_init() -> None:
    """torch's and torch_npu's code call this before using a device: nothing to start here."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return devices.device_count()


def current_device() -> int:
    return devices.current


def set_device(device) -> None:
    """Make `device` (i, "npu:i", torch.device) the current card: "npu" with no index means it."""
    devices.set_current(device)


def get_device_name(device=None) -> str:
    devices.index_of(device)
    return f"Ascend{devices.topology().device}"


class device:
    """Context manager that makes a card current for its block."""

    def __init__(self, device):
        self.idx = devices.index_of(device)
        self.prev_idx = devices.current

    def __enter__(self):
        self.prev_idx = devices.current
        devices.set_current(self.idx)

    def __exit__(self, *exc):
        devices.set_current(self.prev_idx)
        return False


def synchronize(device=None) -> None:
    """The host waits for every stream of the card's Device."""
    devices.device_for(devices.index_of(device)).synchronize()


class Stream:
    """A stream of a card's simulated Device."""

    def __init__(self, device=None, priority: int = 0, _stream=None, **kwargs):
        self.device_index = devices.index_of(device)
        self.priority = priority
        self.npu_stream = _stream if _stream is not None else devices.device_for(self.device_index).stream()

    @property
    def device(self) -> torch.device:
        return torch.device("npu", self.device_index)

    def wait_event(self, event) -> None:
        self.npu_stream.wait_event(event.npu_event)

    def wait_stream(self, stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return self.npu_stream.device.clock >= self.npu_stream.tail

    def synchronize(self) -> None:
        self.npu_stream.synchronize()

    def __eq__(self, other):
        return isinstance(other, Stream) and other.npu_stream is self.npu_stream

    def __hash__(self):
        return id(self.npu_stream)

    def __repr__(self):
        return f"<torch.npu.Stream device=npu:{self.device_index} id={self.npu_stream.id} (emulated)>"


class Event:
    """A point on a stream of a card's simulated Device."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.npu_event = None

    def record(self, stream=None) -> None:
        stream = current_stream() if stream is None else stream
        self.npu_event = stream.npu_stream.record_event()

    def wait(self, stream=None) -> None:
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        return self.npu_event is None or self.npu_event.device.clock >= self.npu_event.time

    def synchronize(self) -> None:
        if self.npu_event is not None:
            self.npu_event.synchronize()

    def elapsed_time(self, end) -> float:
        """Milliseconds from this event to `end`, on the device's simulated clock."""
        if not (self.enable_timing and end.enable_timing):
            raise HcclError("E_PARA", "Both events must be created with argument 'enable_timing=True'.")
        if self.npu_event is None or end.npu_event is None:
            raise HcclError("E_PARA", "Both events must be recorded before calculating elapsed time.")
        return (end.npu_event.time - self.npu_event.time) / 1e6


_current_streams = {}            # card index -> its current Stream


def default_stream(device=None) -> Stream:
    index = devices.index_of(device)
    return Stream(index, _stream=devices.device_for(index).default_stream)


def current_stream(device=None) -> Stream:
    index = devices.index_of(device)
    s = _current_streams.get(index)
    if s is None or s.npu_stream.device is not devices.device_for(index):   # the rank's Device has come since
        s = _current_streams[index] = default_stream(index)
    return s


def set_stream(stream) -> None:
    if stream is not None:
        _current_streams[stream.device_index] = stream


class StreamContext:
    """Makes a stream its card's current stream for a block."""

    def __init__(self, stream):
        self.stream = stream
        self.prev = None

    def __enter__(self):
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.prev is not None:
            set_stream(self.prev)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)


def memory_allocated(device=None) -> int:
    return memory.allocated(devices.index_of(device))


def max_memory_allocated(device=None) -> int:
    return memory.peak(devices.index_of(device))


memory_reserved, max_memory_reserved = memory_allocated, max_memory_allocated


def reset_peak_memory_stats(device=None) -> None:
    memory.reset_peak(devices.index_of(device))


reset_max_memory_allocated = reset_peak_memory_stats


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the card's HBM (the simulated Device's: a communicator's CCL buffer
    takes its share, as on an NPU)."""
    dev = devices.device_for(devices.index_of(device))
    return dev.allocator.free_bytes, dev.hbm_bytes


def empty_cache() -> None:
    """Nothing is cached: a dead tensor's block is free at once."""


def manual_seed(seed) -> None:
    dispatch.generator(devices.current).manual_seed(int(seed))


def manual_seed_all(seed) -> None:
    for index in range(devices.device_count()):
        dispatch.generator(index).manual_seed(int(seed))


def seed() -> None:
    dispatch.generator(devices.current).seed()


def seed_all() -> None:
    manual_seed_all(dispatch.generator(devices.current).seed())


def initial_seed() -> int:
    return dispatch.generator(devices.current).initial_seed()


def get_rng_state(device="npu") -> torch.Tensor:
    return dispatch.generator(devices.index_of(device)).get_state()


def set_rng_state(new_state, device="npu") -> None:
    dispatch.generator(devices.index_of(device)).set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(devices.device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def get_amp_supported_dtype() -> list:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotEmulated("E_NOT_SUPPORT", f"torch.npu.{name} is not emulated by hccl-sim")
