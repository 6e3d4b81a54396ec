"""The one c10d path from C++ that a Python process group's trampoline does not reach: the
dispatcher op `c10d::_allgather_base_`, which the functional collective
`_c10d_functional.all_gather_into_tensor_out` calls (torch 2.13's Functional.cpp calls
`group->_allgather_base`, a method torch's PyProcessGroup does not forward to Python).

torch's CPU kernel for it asks the group for the Backend it registered for the CPU
(`getBackend(CPU)`), which a Python group cannot register (torch's Backend has no Python
constructor), and fails with "No backend type associated with device type cpu". The kernel here
takes its place: an hccl_sim group runs the op as its own `_allgather_base`; any other group (a
gloo group beside it) gets exactly what torch's kernel did, its CPU backend's `_allgather_base`
with the same options. Every other c10d op a C++ caller uses on a Python group (allreduce,
broadcast, the coalesced forms, all_to_all_single, send, recv, barrier, start and end of
coalescing) goes through the trampoline to the group's Python method.
"""
from __future__ import annotations

import warnings
from datetime import timedelta

import torch
from torch._C._distributed_c10d import AllgatherOptions, ProcessGroup

from .process_group import ProcessGroupHcclSim

_LIB = None


def _allgather_base(output, input_, process_group, async_op=True, timeout=-1):
    group = ProcessGroup.unbox(process_group)
    if isinstance(group, ProcessGroupHcclSim):
        # the caller (the functional op) keeps only the boxed C++ Work: the group holds the
        # Python one until it is waited
        work = group.keep_until_waited(group._allgather_base(output, input_))
    else:                       # torch's own kernel: the group's CPU backend, the same options
        opts = AllgatherOptions()
        opts.asyncOp = async_op
        if timeout >= 0:
            opts.timeout = timedelta(milliseconds=timeout)
        work = group._get_backend(output.device)._allgather_base(output, input_, opts)
    return output, work.boxed()


def install() -> None:
    """Put the kernel in torch's place for CPU tensors (once per process). torch warns that a
    kernel is overridden; that is the point here, so the warning is not shown."""
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        lib.impl("_allgather_base_", _allgather_base, "CPU")
    _LIB = lib
