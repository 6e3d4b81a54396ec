"""The entries of a fault plan as a user writes them: the kinds and their fields, each entry
checked when it is added or loaded (every problem an HcclError E_PARA naming the entry), and the
label an entry is known by in errors ("fault plan entry i (kind who)").

hccl_sim.faults.fault_plan holds the plan that keeps the entries and binds them to a run.
"""
from __future__ import annotations

import math

from topologies.errors import HcclError

KINDS = {
    "link_flap": (("a", "b", "at", "duration"), {}),
    "link_down": (("a", "b"), {"at": 0.0}),
    "link_slow": (("a", "b", "factor"), {"at": 0.0, "duration": None}),
    "nic_down": (("rank",), {"at": 0.0, "duration": None}),
    "corrupt": (("a", "b"), {"nth": 0}),
    "rank_crash": (("rank",), {"at_op": None, "at": None, "at_step": None}),
    "straggler": (("rank", "delay"), {"ops": None}),
    "rank_stall": (("rank",), {"at_op": None, "at": None}),
    "hbm_pressure": (("rank",), {"at_op": None, "at": None, "duration": None, "bytes": None}),
}
"""kind -> (required fields, optional fields with their defaults)."""


def entry_label(index: int, entry: dict) -> str:
    """How errors name the entry: "fault plan entry i (kind a-b)" or "(kind rank r)"."""
    who = f"{entry.get('a')}-{entry.get('b')}" if "a" in entry else f"rank {entry.get('rank')}"
    return f"fault plan entry {index} ({entry.get('kind')} {who})"


def bad_entry(index, entry, problem) -> HcclError:
    """The E_PARA of an entry that cannot be run, naming it and the problem."""
    return HcclError("E_PARA", f"{entry_label(index, entry)}: {problem}")


def _rank_field(index, entry, name):
    v = entry[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise bad_entry(index, entry, f"{name} must be a rank (an integer >= 0), got {v!r}")


def _time_field(index, entry, name, positive=False, optional=False):
    v = entry[name]
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        need = "> 0" if positive else ">= 0"
        raise bad_entry(index, entry, f"{name} must be a finite number of seconds {need}, got {v!r}")


def check_entry(index: int, entry: dict) -> dict:
    """The entry with its defaults filled in, or an HcclError naming what is wrong."""
    if not isinstance(entry, dict):
        raise HcclError("E_PARA", f"fault plan entry {index}: expected a mapping with a 'kind', got {entry!r}")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise HcclError("E_PARA", f"fault plan entry {index}: unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
    required, optional = KINDS[kind]
    missing = [f for f in required if f not in entry]
    if missing:
        raise bad_entry(index, entry, f"missing {', '.join(missing)}")
    unknown = sorted(set(entry) - set(required) - set(optional) - {"kind"})
    if unknown:
        raise bad_entry(index, entry, f"unknown field(s) {', '.join(unknown)}; {kind} takes "
                        f"{', '.join(required + tuple(optional))}")
    out = {"kind": kind, **{f: entry[f] for f in required}, **{f: entry.get(f, d) for f, d in optional.items()}}
    for f in ("a", "b", "rank"):
        if f in out:
            _rank_field(index, out, f)
    if "a" in out and out["a"] == out["b"]:
        raise bad_entry(index, out, f"a and b are the same rank ({out['a']}): a rank has no link to itself")
    if kind == "hbm_pressure":
        if out["at_op"] is not None and out["at"] is not None:
            raise bad_entry(index, out, "give at_op (an op index) or at (seconds), not both")
        if out["at_op"] is None and out["at"] is None:
            out["at"] = 0.0             # from the job's start
        b = out["bytes"]
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b <= 0):
            raise bad_entry(index, out, f"bytes must be a number of bytes > 0 (an integer), or None for all the "
                            f"HBM that is free, got {b!r}")
    if "at" in out:
        _time_field(index, out, "at", optional=kind in ("rank_crash", "rank_stall", "hbm_pressure"))
    if "duration" in out:
        _time_field(index, out, "duration", positive=True, optional=kind != "link_flap")
    if kind == "link_slow":
        f = out["factor"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f:
            raise bad_entry(index, out, f"factor must be a number > 0 (the bandwidth is multiplied by it), got {f!r}")
    if kind == "corrupt":
        n = out["nth"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise bad_entry(index, out, f"nth must be an integer >= 0 (0 = the first transfer), got {n!r}")
    if kind == "straggler":
        _time_field(index, out, "delay", positive=True)
        ops = out["ops"]
        if ops is not None:
            if not isinstance(ops, (list, tuple)) or not all(isinstance(o, int) and not isinstance(o, bool)
                                                              and o >= 0 for o in ops):
                raise bad_entry(index, out, f"ops must be a list of op indices (integers >= 0) or None, got {ops!r}")
            out["ops"] = sorted(set(ops))
    if kind in ("rank_stall", "hbm_pressure"):
        v = out["at_op"]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise bad_entry(index, out, f"at_op must be an integer >= 0, got {v!r}")
    if kind == "rank_stall":
        given = [f for f in ("at_op", "at") if out[f] is not None]
        if len(given) != 1:
            raise bad_entry(index, out, "give exactly one of at_op (an op index) or at (seconds)")
    if kind == "rank_crash":
        given = [f for f in ("at_op", "at") if out[f] is not None]
        if len(given) != 1:
            raise bad_entry(index, out, "give exactly one of at_op (an op index) or at (seconds)")
        for f in ("at_op", "at_step"):
            v = out[f]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise bad_entry(index, out, f"{f} must be an integer >= 0, got {v!r}")
        if out["at_step"] is not None and out["at_op"] is None:
            raise bad_entry(index, out, "at_step needs at_op (the op whose step it is)")
    return out
