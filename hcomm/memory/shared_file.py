"""What processes of one host that share memory stand on: a /dev/shm file mapped shared, the
futex calls that let a process sleep on a word of it until a peer changes it, and how to tell a
live process from a pid reused. Used by the shared-memory control block (hcomm.control.shm) and
the socket transport's same-host rings (hcomm.transports.host_rings); the order of their words'
accesses is hcomm.memory.ordered's.

futex(2) has no libc wrapper, so it is called by its syscall number, which differs per machine:
`SYS_FUTEX` is this process's, or None on a machine not served (`check_machine` then says so). The
machine is the running interpreter's ELF e_machine (/proc/self/exe), not uname's: a 32-bit or
emulated userland on a 64-bit kernel makes the syscalls of its own ABI.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys

from topologies.errors import HcclError

FUTEX_WAIT, FUTEX_WAKE = 0, 1        # not FUTEX_PRIVATE: the words are shared between processes
# ELF e_machine -> (name, futex syscall number), from the kernel's tables (Linux 6.x):
#   62  EM_X86_64:  arch/x86/entry/syscalls/syscall_64.tbl, "202 common futex"
#   183 EM_AARCH64: include/uapi/asm-generic/unistd.h, "#define __NR_futex 98" (arm64 uses the generic table)
#   21  EM_PPC64:   arch/powerpc/kernel/syscalls/syscall.tbl, "221 common futex" (little-endian only, below)
# Only little-endian machines: a futex compares the first 4 bytes of an 8-byte word, which are its
# low half only there. Machines with an atomics wheel but left out: s390x (big-endian), i686 and
# 32-bit Arm (32-bit userlands, never tried).
# Named as Debian names them (amd64 is uname's x86_64).
MACHINES = {62: ("amd64", 202), 183: ("aarch64", 98), 21: ("ppc64le", 221)}


def _elf_machine():
    """(e_machine, little-endian?) of the running interpreter, (None, None) if unreadable."""
    try:
        with open("/proc/self/exe", "rb") as f:
            head = f.read(20)
    except OSError:
        return None, None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None, None
    little = head[5] == 1
    return int.from_bytes(head[18:20], "little" if little else "big"), little


def _this_machine():
    em, little = _elf_machine()
    name, nr = MACHINES.get(em, (None, None))
    return (name, nr) if little and sys.byteorder == "little" else (None, None)


MACHINE, SYS_FUTEX = _this_machine()


def check_machine() -> None:
    """E_NOT_SUPPORT unless this machine's futex number is known (shared-memory planes need it)."""
    if SYS_FUTEX is None:
        em, _ = _elf_machine()
        served = ", ".join(f"{n} Linux" for n, _ in MACHINES.values())
        raise HcclError("E_NOT_SUPPORT", f"the shared-memory planes (control block, same-host rings) run on "
                                         f"{served}; this is {os.uname().machine} (ELF machine {em}, "
                                         f"{sys.byteorder}-endian); the local engine, Ray's object plane "
                                         f"and MPI's planes need neither")


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
        check_machine()
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
            self.map = mmap.mmap(fd, size)    # (a slice of it is a bytes copy: the cheapest read)
            self.size = size
        finally:
            os.close(fd)
        self.buf = memoryview(self.map)

    def close(self):
        self.buf.release()
        self.map.close()

    def unlink(self):
        os.unlink(self.path)


def proc_start_time(pid: int):
    """The process's start time in clock ticks (tells a live peer from a reused pid), None if gone.

    Read from its main thread's entry (task/<pid>), the same figure as /proc/<pid>/stat's: that one
    qemu-user answers itself for its own process, with the calling thread's start time."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):        # killed but not yet reaped: as good as gone
        return None
    return int(fields[19])
