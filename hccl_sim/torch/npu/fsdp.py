"""FSDP2's storage free and allocation on emulated NPUs.

FSDP2 frees an unsharded parameter's memory by resizing its storage to nothing and allocates it
again by resizing it back (`_fsdp_param.free_storage` / `alloc_storage`). torch resizes a
PrivateUse1 storage through a C++ hook a Python backend cannot give, so for npu tensors these two
give the storage's block of simulated HBM back and charge it again (`memory.suspend` / `resume`:
memory statistics and out-of-memory behave as on a device), while the host bytes stay where they
are; other devices' tensors are resized as torch does. The names are replaced where FSDP2 looks
them up (its `_fsdp_param` and `_fsdp_param_group` modules).
"""
from __future__ import annotations

from . import memory


def install() -> None:
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    if getattr(_fsdp_param.alloc_storage, "__hccl_sim__", False):
        return
    resize_up, resize_down = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor) -> None:
        if tensor.device.type == "npu":
            memory.resume(tensor)
        else:
            resize_up(tensor)

    def free_storage(tensor) -> None:
        if tensor.device.type == "npu":
            memory.suspend(tensor)
        else:
            resize_down(tensor)

    alloc_storage.__hccl_sim__ = True
    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
