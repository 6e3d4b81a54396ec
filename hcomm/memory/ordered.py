"""Ordered loads and stores of the 8-byte words that processes of one host publish to each other in
shared memory (a control block's sequences, a ring's head and tail, a rank's step words, doorbells).

Why: a publisher writes data (a payload, a ring slot, a numpy slice), then a word that says it is
there; a reader reads the word, then the data. A TSO machine (amd64) keeps stores in order and
loads in order, so plain memoryview accesses sufficed there; aarch64 (Kunpeng) and POWER reorder
both, and a reader could see the word before the data. So the word is written with a release store and read with an
acquire load: everything the writer did before the store is visible to a reader after the load.
Python has no such accesses; the `atomics` package (patomic's lock-free ops, manylinux wheels for
amd64, aarch64, ppc64le) has them.

Cost: `atomics`' own view objects wrap every call's result in a fresh cffi buffer (about 6 us a
load, measured); the same ops called here straight from its op table cost one ctypes call (about
0.3-0.8 us, against 0.03 us for a plain memoryview access). So callers keep polling with plain
loads (an aligned 8-byte access is single-copy atomic on every machine served here) and make the
one acquire load, on the word that was seen to change, only when they act on it.

`store_fenced` is for the two sides of a sleep protocol (a Dekker pattern: "I changed X, do you
sleep?" against "I sleep, did X change?"): a sequentially consistent store followed by a
sequentially consistent load of the same word, after which later loads cannot be performed
before the store (ARMv8: stlr then ldar; amd64: a locked store), so a waker that reads the sleepers' words next
sees every sleeper whose futex compare could have missed its store.
"""
from __future__ import annotations

import ctypes

import atomics
# The op table atomics' views call through: the package's Python layer above it costs 20x the op.
from atomics._impl.patomic import Patomic

from topologies.errors import HcclError

_ACQUIRE = int(atomics.MemoryOrder.ACQUIRE)
_RELEASE = int(atomics.MemoryOrder.RELEASE)
_SEQ_CST = int(atomics.MemoryOrder.SEQ_CST)
_I64, _byref, _addressof = ctypes.c_int64, ctypes.byref, ctypes.addressof

_ops = Patomic.ops(8)
_load, _store = _ops.fp_load, _ops.fp_store


def _check():
    if not _load or not _store:
        raise HcclError("E_NOT_SUPPORT", "this machine has no lock-free 8-byte atomic load and store "
                                         "(atomics/patomic): shared-memory planes cannot run here")


def address_of(buf) -> int:
    """The address of a writable buffer's first byte (a shared mapping's), exporting nothing."""
    probe = ctypes.c_char.from_buffer(buf)
    at = _addressof(probe)
    del probe                            # an export would keep the mapping from closing
    return at


class Words:
    """The 8-byte words of the shared mapping `buf` (a memoryview; its start 8-byte aligned), by
    index as `buf.cast("q")` numbers them. Holds no export of `buf`: the owner keeps the mapping
    open while it uses this."""
    __slots__ = ("base",)

    def __init__(self, buf):
        _check()
        self.base = address_of(buf)
        if self.base % 8:
            raise HcclError("E_INTERNAL", f"shared words at {self.base:#x}: not 8-byte aligned")

    def load(self, index: int) -> int:
        """Acquire load: what the word's writer did before storing the value read is visible now."""
        r = _I64()
        _load(self.base + index * 8, _ACQUIRE, _byref(r))
        return r.value

    def store(self, index: int, value: int) -> None:
        """Release store: everything this process wrote before is visible to a reader that loads
        `value` with acquire."""
        _store(self.base + index * 8, _byref(_I64(value)), _RELEASE)

    def store_fenced(self, index: int, value: int) -> None:
        """A store no later load of this thread is performed before (module docstring)."""
        at = self.base + index * 8
        _store(at, _byref(_I64(value)), _SEQ_CST)
        _load(at, _SEQ_CST, _byref(_I64()))     # not merely acquire: ARMv8.3's ldapr may pass an stlr
