"""The error of a torch_npu name hccl-sim does not emulate."""
from __future__ import annotations

from topologies.errors import HcclError


class NotEmulated(HcclError, AttributeError):
    """HcclError E_NOT_SUPPORT naming what is not emulated. It is an AttributeError too: Python's
    and torch's probes of a module (`hasattr`, `getattr(mod, name, None)`, `from torch_npu import
    x`) expect one, and must keep working; a script that uses the name gets this message."""

    def __init__(self, code: str, message: str):
        HcclError.__init__(self, code, message)
