"""What processes of one host that share memory stand on: a /dev/shm file mapped shared, the
futex calls that let a process sleep on a word of it until a peer changes it, and how to tell a
live process from a pid reused. Used by the shared-memory control block (hcomm.control.shm) and
the socket transport's same-host rings (hcomm.transports.host_rings).
"""
from __future__ import annotations

import ctypes
import mmap
import os
import platform

FUTEX_WAIT, FUTEX_WAKE = 0, 1        # not FUTEX_PRIVATE: the words are shared between processes
SYS_FUTEX = {"x86_64": 202}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
futex_call = _libc.syscall           # ctypes releases the GIL for the call: a sleeper blocks no thread
futex_call.restype = ctypes.c_long
L = ctypes.c_long                    # syscall is variadic: pass every argument full width


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Futex:
    """A 32-bit word at `address` of a shared mapping: `wait(expected, timeout_s)` sleeps while it
    holds `expected` (at most timeout_s), `wake()` wakes every sleeper on it."""
    __slots__ = ("_wait", "_wake", "_ts", "_ts_ref")

    def __init__(self, address: int):
        if SYS_FUTEX is None:
            raise OSError(f"futex calls are wired for x86-64 only (this is {platform.machine()})")
        self._wait = (L(SYS_FUTEX), L(address), L(FUTEX_WAIT))
        self._wake = (L(SYS_FUTEX), L(address), L(FUTEX_WAKE), L(0x7FFFFFFF), None, None, L(0))
        self._ts = Timespec()
        self._ts_ref = ctypes.byref(self._ts)

    def wait(self, expected: int, timeout_s: float) -> None:
        self._ts.tv_sec = int(timeout_s)
        self._ts.tv_nsec = int((timeout_s - int(timeout_s)) * 1e9)
        futex_call(*self._wait, L(expected), self._ts_ref, None, L(0))

    def wake(self) -> None:
        futex_call(*self._wake)


class Mapping:
    """A /dev/shm file mapped shared. Not multiprocessing.shared_memory: its resource tracker,
    shared by spawned children, would track (and complain about or unlink) a segment every
    attacher registers."""

    def __init__(self, name: str, create_bytes: int | None = None, header_bytes: int = 64):
        self.name, self.path = name, f"/dev/shm/{name}"
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create_bytes is not None else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create_bytes is not None:
                os.ftruncate(fd, create_bytes)
            size = os.fstat(fd).st_size
            if size < header_bytes:         # its creator is still sizing it
                raise FileNotFoundError(self.path)
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self):
        self.buf.release()
        self._mmap.close()

    def unlink(self):
        os.unlink(self.path)


def proc_start_time(pid: int):
    """The process's start time in clock ticks (tells a live peer from a reused pid), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):        # killed but not yet reaped: as good as gone
        return None
    return int(fields[19])
