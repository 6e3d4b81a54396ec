"""The result pool: arrays handed to user code as collectives' results, reused once it drops them.

A fresh large array costs a page fault per page on its first write, every op; a training loop
asks for results of the same few shapes again and again. The pool hands back an array user code
no longer holds, so a loop reuses the same few.

The reuse rule, written here only: an entry is free when nothing but the pool refers to its
array (`sys.getrefcount` sees the pool's own entry and its argument). A view of the array
refers to it as its base, so a view user code holds keeps the array in use too.

The pool keeps at most `spare` entries, held or free. When it is full, the least recently used
free entry makes room; when user code holds every one, `get` returns None and the caller makes
a plain array (an op then stages its output and copies it out).
"""
from __future__ import annotations

import math
import sys

import numpy as np

_FREE_REFS = 2          # the pool's entry list and getrefcount's own argument


def is_free(entry: list) -> bool:
    """Whether user code has dropped the array of a pool entry ([capacity, array, handle])."""
    return sys.getrefcount(entry[1]) <= _FREE_REFS


class ResultPool:
    """Results of one rank (see the module docstring).

    `alloc(nbytes, shape, dtype)` makes a new entry's memory: (handle, array), or None when there
    is no room. `refit(handle, shape, dtype)`, where given, views a free entry's memory (at least
    as large) as another shape: memory that cannot be freed one piece at a time (an MPI window)
    is then reused across sizes instead of only for one shape."""

    def __init__(self, spare: int, alloc, refit=None):
        self.spare, self._alloc, self._refit = spare, alloc, refit
        self._entries: list[list] = []      # [capacity bytes, array, handle], least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, shape, dtype):
        """A result array of `shape` and `dtype` user code may write into and keep, or None."""
        dtype, shape = np.dtype(dtype), tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        entries = self._entries
        fit = None
        for i, entry in enumerate(entries):
            if not is_free(entry):
                continue
            arr = entry[1]
            if arr.shape == shape and arr.dtype == dtype:
                entries.append(entries.pop(i))          # the most recently used last
                return arr
            del arr
            if fit is None and self._refit is not None and entry[0] >= nbytes:
                fit = i
        if fit is not None:
            entry = entries.pop(fit)
            entry[1] = self._refit(entry[2], shape, dtype)
            entries.append(entry)
            return entry[1]
        if len(entries) >= self.spare:
            free = next((i for i, e in enumerate(entries) if is_free(e)), None)
            if free is None:
                return None                             # user code holds every one
            del entries[free]                           # the least recently used free one makes room
        got = self._alloc(nbytes, shape, dtype)
        if got is None:
            return None
        handle, arr = got
        entries.append([nbytes, arr, handle])
        return arr

    def all_held(self) -> bool:
        """Whether the pool is full and user code holds every entry."""
        return len(self._entries) >= self.spare and not any(is_free(e) for e in self._entries)

    def slot(self, nbytes: int):
        """The handle of pool memory of at least `nbytes` an op may stage its output in (a host
        output, copied out after the op): a free entry at least as large, else a new entry, which
        a later `get` hands out as a result; None when there is no room. With `refit` only."""
        entries = self._entries
        for i, entry in enumerate(entries):
            if entry[0] >= nbytes and is_free(entry):
                entries.append(entries.pop(i))
                return entry[2]
        if len(entries) >= self.spare:
            free = next((i for i, e in enumerate(entries) if is_free(e)), None)
            if free is None:
                return None
            del entries[free]
        got = self._alloc(nbytes, (nbytes,), np.dtype(np.uint8))
        if got is None:
            return None
        entries.append([nbytes, got[1], got[0]])
        return got[0]

    def handles(self, held_only: bool = False) -> list:
        """The handles of the pool's entries (only those user code still holds, with `held_only`)."""
        return [e[2] for e in self._entries if not (held_only and is_free(e))]

    def clear(self) -> None:
        """Forget every entry (memory user code still holds stays valid as long as it does)."""
        self._entries.clear()
