"""Checks of user-given numbers shared by every layer: counts, ranks, sizes, bandwidths, times,
and the device ids of a preset's servers.

Python's bool is an int and numpy's integers are not, so `isinstance(x, int)` both accepts
`servers=True` (one server, silently) and rejects `np.int64(8)`; these helpers accept exactly
the integers a user means (int and numpy integers, never bools) and finite or infinite reals
where a bound says so, and raise HcclError(E_PARA) naming the parameter, the value and the
accepted range otherwise.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .errors import HcclError


def is_integer(value) -> bool:
    """True for int and numpy integers; False for bools (True is not a count), floats, strings."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(value, what: str, lo: int | None = None, hi: int | None = None, where: str = "",
            limit: str = "") -> int:
    """`value` as a Python int in [lo, hi], or HcclError(E_PARA) naming `what` (and `where`);
    `limit` names the constant behind `hi`, said when the value is over it."""
    if limit and is_integer(value) and hi is not None and value > hi:
        raise HcclError("E_PARA", f"{where}{': ' if where else ''}{what}={value} is over the limit of {hi} ({limit})")
    if not is_integer(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is not None and hi is not None:
            wanted = f"an integer in [{lo}, {hi}]"
        elif lo is not None:
            wanted = "a positive integer" if lo == 1 else ("a non-negative integer" if lo == 0 else f"an integer >= {lo}")
        else:
            wanted = "an integer"
        kind = "" if is_integer(value) else f" ({type(value).__name__})"
        raise HcclError("E_PARA", f"{where}{': ' if where else ''}{what} must be {wanted}, got {value!r}{kind}")
    return int(value)


def real(value, what: str, lo: float, hi: float, lo_inclusive: bool = True, allow_inf: bool = False,
         unit: str = "", where: str = "") -> float:
    """`value` as a float in [lo, hi] (or (lo, hi]; +inf only if allow_inf), else HcclError(E_PARA).

    NaN, strings, bools and complex numbers are refused."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    v = float(value) if ok else math.nan
    if ok and math.isinf(v) and v > 0 and allow_inf:
        return v
    if not (ok and (v >= lo if lo_inclusive else v > lo) and v <= hi):
        if math.isinf(hi):
            wanted = f"a number {'>=' if lo_inclusive else '>'} {lo:g}" + (" (inf allowed)" if allow_inf else "")
        else:
            wanted = f"a number in {'[' if lo_inclusive else '('}{lo:g}, {hi:g}]"
        wanted += f" {unit}" if unit else ""
        kind = "" if ok else f" ({type(value).__name__})"
        raise HcclError("E_PARA", f"{where}{': ' if where else ''}{what} must be {wanted}, got {value!r}{kind}")
    return v


def device_ids_checked(devices_per_server, device_ids, most: int, where: str) -> None:
    """E_PARA unless each server's device ids are distinct and in [0, most], one per device (gaps
    allowed: HCCL's rank table asks no more; docs/references.md §8.1)."""
    if len(device_ids) != len(devices_per_server):
        raise HcclError("E_PARA", f"{where}: device_ids lists {len(device_ids)} servers for {len(devices_per_server)}")
    for s, (n, devs) in enumerate(zip(devices_per_server, device_ids)):
        if len(devs) != n or len(set(devs)) != n:
            raise HcclError("E_PARA", f"{where}: server {s}'s device_ids {list(devs)} are not {n} distinct ids")
        bad = [d for d in devs if not 0 <= d <= most]
        if bad:
            raise HcclError("E_PARA", f"{where}: server {s}'s device_id {bad[0]} is out of range [0, {most}] "
                            "(the preset's max_device_id)")
