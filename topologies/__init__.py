"""Cluster descriptions for hccl-sim: hardware and synthetic presets, HCCL rank tables.

`load(spec, **params)` accepts a preset name ("atlas800t-a2", "atlas800-910a", "atlas900-a3",
"atlas950", its named sizes "atlas950-superpod" and "atlas950-supercluster", "fullmesh", "ring") or
the path of an HCCL rank-table JSON file, and returns a `Topology`.
"""
from __future__ import annotations

import os

from .errors import HCCL_RESULT, HcclError
from .model import DeviceModel, Route, Topology, is_power_of_two, seconds_to_ns, transfer_ns
from .presets import (ALIASES, HARDWARE_PRESETS, MAX_LATENCY, MAX_RANKS, MIN_BANDWIDTH, SIZED_PRESETS,
                      SYNTHETIC_PRESETS, filled, hardware, hardware_name, sized_defaults, synthetic)
from . import ranktable

__all__ = ["load", "Topology", "Route", "DeviceModel", "HcclError", "HCCL_RESULT", "ranktable",
           "is_power_of_two", "seconds_to_ns", "transfer_ns", "PRESETS", "MAX_RANKS", "MIN_BANDWIDTH",
           "MAX_LATENCY"]

PRESETS = HARDWARE_PRESETS + tuple(SIZED_PRESETS) + SYNTHETIC_PRESETS


def load(spec, **params) -> Topology:
    """Build a topology from a preset name or a rank-table path.

    Hardware presets take `servers=N` (atlas900-a3 and atlas950 also `superpods=K`, with `servers` per superpod:
    one count, or a list of K); synthetic ones `ranks`, `bandwidth` (bytes/s),
    `latency` (s) and `reduce_bandwidth` (bytes/s); a rank table takes `preset=` (the server type
    its servers are, default atlas800t-a2, atlas900-a3 for a version 1.2 table). No topology has more than MAX_RANKS (1,048,576) ranks;
    bandwidths are >= MIN_BANDWIDTH bytes/s and latencies <= MAX_LATENCY s.
    """
    if isinstance(spec, Topology):
        if params:
            raise HcclError("E_PARA", f"topology: parameters {sorted(params)} given with an existing Topology")
        return spec
    if not isinstance(spec, str):
        raise HcclError("E_PARA", f"topology: expected a preset name or rank-table path, got {type(spec).__name__}")
    name = ALIASES.get(spec.lower(), spec.lower())
    sized = sized_defaults(name)
    if sized is not None:                # a named size of a preset: its servers / superpods by default
        name, defaults = sized
        params = {**defaults, **params}
    allowed = {"atlas800t-a2": {"servers"}, "atlas800-910a": {"servers"}, "atlas900-a3": {"servers", "superpods"},
               "atlas950": {"servers", "superpods"},
               "fullmesh": {"ranks", "bandwidth", "latency", "reduce_bandwidth"},
               "ring": {"ranks", "bandwidth", "latency", "reduce_bandwidth"}}
    if name in allowed:
        unknown = set(params) - allowed[name]
        if unknown:
            raise HcclError("E_PARA", f"topology {name}: unknown parameter(s) {sorted(unknown)}; "
                            f"it takes {sorted(allowed[name])}")
        if name in HARDWARE_PRESETS:
            return hardware(name, **params)
        if "ranks" not in params:
            raise HcclError("E_PARA", f"topology {name}: ranks=N is required")
        return synthetic(name, **params)
    if spec.endswith(".json") or os.path.sep in spec or os.path.exists(spec):
        unknown = set(params) - {"preset"}
        if unknown:
            raise HcclError("E_PARA", f"rank table {spec}: unknown parameter(s) {sorted(unknown)}; it takes ['preset']")
        preset = params.get("preset")
        return ranktable.load(spec, preset=None if preset is None else hardware_name(preset))
    raise HcclError("E_PARA", f"unknown topology {spec!r}: expected one of {list(PRESETS)} or a rank-table .json path")
