"""The memory of emulated NPU tensors: host memory that torch sees as "npu" memory, charged to the
simulated HBM.

torch gives a Python backend no allocator of its own, but it imports DLPack tensors of any device:
an npu storage is a CPU storage exported by torch's own DLPack exporter, its capsule's device
rewritten to kDLExtDev, which torch maps to PrivateUse1 ("npu"). The capsule's deleter is torch's:
when the npu storage dies it drops the CPU tensor it was exported from, and so the CPU bytes. So an
npu tensor is a plain torch.Tensor (its `data_ptr()` a host address; its views share its storage as
on any device), and `host_view` gives a CPU tensor over the same bytes the same way (an npu tensor
exported, its device rewritten to kDLCPU), which keeps the npu storage alive while it lives.
No Python runs inside torch's deleters: what frees a storage's HBM block is an attribute of the
exported CPU tensor, whose Python object torch keeps with the tensor and releases with it.

HBM: each new npu storage takes a block of the simulated Device of its card (hccl_sim.npu.device;
which Device that is: `devices.device_for`). Its size is torch_npu's caching allocator's
`round_size`: the bytes plus 32 of padding (`AddPadSize` before the Ascend 950), rounded up to
512 (docs/references.md §7.6). A block that does not fit is torch_npu's out-of-memory error,
`torch.OutOfMemoryError` with its text. Nothing is cached: a storage's block is free again as soon
as the storage dies, so reserved memory is allocated memory.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np
import torch

from topologies.errors import HcclError

from . import devices

PAD_BYTES = 32                   # torch_npu's AddPadSize() before the Ascend 950 (§7.6)
BLOCK_BYTES = 512                # its kMinBlockSize: every block a multiple of it
_DL_CPU, _DL_EXT = 1, 12         # DLPack device types: kDLCPU, kDLExtDev (torch: PrivateUse1)
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU = torch.device("cpu")


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLManagedHead(ctypes.Structure):
    """The start of DLPack's DLManagedTensor (dl_tensor.data, dl_tensor.device)."""
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_lock = threading.Lock()
_stats = {}                      # card index -> [allocated bytes, peak bytes]
_charges = {}                    # a live npu storage's data pointer -> its _Charge (suspend / resume)


class _Charge:
    """A storage's HBM block, freed when the storage's exported CPU tensor (which holds this) dies."""
    __slots__ = ("block", "index")

    def __init__(self, block, index):
        self.block, self.index = block, index

    def __del__(self):
        try:
            if self.block is not None:
                unreserve(self.index, self.block)
        except Exception:        # noqa: BLE001 - the device may be finalised, or the process ending
            pass


def _retarget(t: torch.Tensor, dl_device: int, index: int) -> torch.Tensor:
    """`t` (a 1-D uint8 tensor over a whole storage) exported by torch's DLPack and imported on
    another device: the same bytes, kept alive by the import."""
    capsule = torch.utils.dlpack.to_dlpack(t)
    head = ctypes.cast(_capsule_pointer(capsule, b"dltensor"), ctypes.POINTER(_DLManagedHead))
    head.contents.device = _DLDevice(dl_device, index)
    return torch._C._from_dlpack(capsule)


def _flat(storage, device) -> torch.Tensor:
    """A 1-D uint8 tensor over the whole of `storage` (metadata only)."""
    empty = torch.empty(0, dtype=torch.uint8, device=device)
    return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KEYS, empty, storage, 0, (storage.nbytes(),), (1,))


def _shaped(flat: torch.Tensor, like) -> torch.Tensor:
    """`flat` (uint8 bytes of a storage) seen as `like`'s dtype, size, strides and offset
    (metadata only: the CPU kernels of views run on any device's tensors)."""
    whole = flat.numel() - flat.numel() % like.element_size()   # a storage's bytes may end mid-element
    typed = flat if like.dtype == torch.uint8 else flat[:whole].view(like.dtype)
    return torch.ops.aten.as_strided.default.redispatch(_CPU_KEYS, typed, like.size(), like.stride(),
                                                        like.storage_offset())


def charged_bytes(nbytes: int) -> int:
    """The HBM block torch_npu's caching allocator takes for `nbytes` (round_size, §7.6)."""
    return -(-(int(nbytes) + PAD_BYTES) // BLOCK_BYTES) * BLOCK_BYTES


def reserve(index: int, nbytes: int):
    """Charge a new storage of `nbytes` to card `index`'s HBM: its block (None for no bytes), or
    torch_npu's out-of-memory error."""
    if nbytes <= 0:
        return None
    device = devices.device_for(index)
    size = charged_bytes(nbytes)
    try:
        block = device.empty((size,), np.uint8, tag="torch tensor")
    except HcclError as exc:
        if exc.code != "E_MEMORY":
            raise
        raise torch.OutOfMemoryError(oom_message(index, size, device)) from exc
    with _lock:
        s = _stats.setdefault(index, [0, 0])
        s[0] += block.nbytes
        s[1] = max(s[1], s[0])
    return block


def unreserve(index: int, block) -> None:
    """Give a block back (its storage died, or none took it)."""
    with _lock:
        _stats[index][0] -= block.nbytes
    block.device.free(block)


def to_npu(cpu: torch.Tensor, index: int, block=None) -> torch.Tensor:
    """An npu tensor over `cpu`'s storage (a fresh one: its bytes become npu memory), with `cpu`'s
    geometry; `block`: its HBM block when already reserved (factories reserve before they
    allocate), else one is charged here."""
    storage = cpu.untyped_storage()
    if block is None:
        block = reserve(index, storage.nbytes())
    owner = _flat(storage, _CPU)
    if block is not None:
        charge = owner._hccl_sim_charge = _Charge(block, index)
        ptr = storage.data_ptr()
        with _lock:
            _charges[ptr] = charge
        weakref.finalize(owner, _charges.pop, ptr, None)
    return _shaped(_retarget(owner, _DL_EXT, index), cpu)


def suspend(t: torch.Tensor) -> None:
    """Give npu tensor `t`'s storage's HBM block back while its bytes stay (a resize to nothing,
    which a Python backend's storage cannot make: FSDP2's free of an unsharded parameter)."""
    with _lock:
        charge = _charges.get(t.untyped_storage().data_ptr())
    if charge is not None and charge.block is not None:
        block, charge.block = charge.block, None
        unreserve(charge.index, block)


def resume(t: torch.Tensor) -> None:
    """Charge a suspended storage's block again (FSDP2's allocation): torch_npu's out-of-memory
    error where it does not fit."""
    storage = t.untyped_storage()
    with _lock:
        charge = _charges.get(storage.data_ptr())
    if charge is not None and charge.block is None:
        charge.block = reserve(charge.index, storage.nbytes())


def view_on(npu: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A view of `npu`'s storage with `like`'s dtype and geometry (an op's result that aliases an
    input's bytes)."""
    base = npu if npu.dtype == like.dtype else npu.view(like.dtype)
    return torch.ops.aten.as_strided.default.redispatch(_CPU_KEYS, base, like.size(), like.stride(),
                                                        like.storage_offset())


def host_view(t: torch.Tensor, keep: bool = True) -> torch.Tensor:
    """A CPU tensor over npu tensor `t`'s bytes, with its shape, strides, offset and dtype. `keep`:
    it keeps `t`'s storage alive (what a caller may hold); without, it is a bare alias for the
    length of a call that holds `t` (the dispatcher's kernels)."""
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype)
    if keep:
        flat = _retarget(_flat(storage, t.device), _DL_CPU, 0)
    else:
        raw = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), _CPU, storage.nbytes())
        flat = _flat(raw, _CPU)
    return _shaped(flat, t)


def allocated(index: int) -> int:
    return _stats.get(index, [0, 0])[0]


def peak(index: int) -> int:
    return _stats.get(index, [0, 0])[1]


def reset_peak(index: int) -> None:
    with _lock:
        s = _stats.setdefault(index, [0, 0])
        s[1] = s[0]


def _format_size(n: int) -> str:
    """torch_npu's format_size (NPUCachingAllocator.cpp): bytes up to 1 KiB, then two decimals."""
    for limit, unit, div in ((1024, "bytes", 1), (1 << 20, "KiB", 1024.0), (1 << 30, "MiB", 1048576.0)):
        if n <= limit:
            return f"{n} bytes" if div == 1 else f"{n / div:.2f} {unit}"
    return f"{n / 1073741824.0:.2f} GiB"


def oom_message(index: int, size: int, device) -> str:
    """torch_npu's out-of-memory text (NPUCachingAllocator.cpp, §7.6): allocated, active and
    reserved are this card's tensors (no cache: all three the same); free is the HBM's."""
    used = allocated(index)
    f = _format_size
    return (f"NPU out of memory. Tried to allocate {f(size)} (NPU {index}; {f(device.hbm_bytes)} total capacity; "
            f"{f(used)} already allocated; {f(used)} current active; {f(device.allocator.free_bytes)} free; "
            f"{f(used)} reserved in total by PyTorch).If reserved memory is >> allocated memory try setting "
            "max_split_size_mb to avoid fragmentation.")


def patch_storage_constructor() -> None:
    """torch makes some storages with the device's allocator directly (`UntypedStorage(n,
    device=...)`: a storage's clone, deepcopy, `.to()`), and a Python backend has none: such an npu
    storage is made as the storage of a new npu tensor instead, charged like any."""
    cls = torch.UntypedStorage
    made = cls.__new__

    def __new__(klass, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "npu" and klass is cls:
            if len(args) == 1 and isinstance(args[0], int) and not kwargs:
                return torch.empty(args[0], dtype=torch.uint8, device=device).untyped_storage()
            raise HcclError("E_NOT_SUPPORT", "an npu UntypedStorage is made from its size in bytes only "
                            f"(got {args!r} {kwargs!r}); make a tensor on npu instead")
        return made(klass, *args, **kwargs) if device is None else made(klass, *args, device=device, **kwargs)

    cls.__new__ = staticmethod(__new__)
