"""HCCL_ALGO, parsed as HCCL parses it (hcomm alg_env_config.cc; docs/references.md §7.1, §7.7).

HCCL reads HCCL_ALGO by one of two grammars. The legacy one, below, is what HCCL reads on A2 and A3;
the open-source HCCL's executor grammar (`alg_parse`, e.g. `allreduce:sequence{mesh2die,nhr}`) is
what it reads on the Ascend 950, falling back to the legacy one when a value is not of it. A value
is parsed by both here (the device is not known yet); it is an error only when neither reads it,
and selection (which knows the device) refuses a grammar the device does not read. Spaces are
removed first, and a value that is then empty means HCCL's own selection, as unset.

The legacy grammar's two forms:
  global  "level0:NA;level1:<algo>[;level2:<algo>]"
  per-op  "<op>=level0:NA;level1:<algo>/<op>=level0:NA;level1:<algo>"
Tokens are case-sensitive: null ring pipeline fullmesh H-D_R pairwise NHR NHR_V1 AHC AHC_BROKE NB NA.
Errors, as in HCCL: an empty entry (leading, trailing or doubled ';' or '/'), a duplicated level or
op, a level outside level0..level3, an unknown token or op, mixing the two forms, more than one
global configuration, and level0 "null" in a per-op configuration. Every error is an HcclError
naming HCCL_ALGO and the expected form (HCCL reports EI0001).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from topologies.errors import HcclError

from .alg_parse import describe, parse_executor_config

ALGO_TOKENS = ("null", "ring", "pipeline", "fullmesh", "H-D_R", "pairwise", "NHR", "NHR_V1",
               "AHC", "AHC_BROKE", "NB", "NA")
OP_NAMES = ("allgather", "reducescatter", "allreduce", "broadcast", "reduce", "scatter", "alltoall",
            "send", "receive", "gather", "sendrecv", "others")
EXPECTED = ("level0:NA;level1:<algo> or "
            "<op0>=level0:NA;level1:<algo0>/<op1>=level0:NA;level1:<algo1>")
MAX_LEVELS = 4


def _error(source: str, value: str, problem: str) -> HcclError:
    return HcclError("E_PARA", f"{source}={value!r} is invalid: {problem}; expected {EXPECTED}")


@dataclass(frozen=True)
class AlgoConfig:
    """Parsed HCCL_ALGO: level -> token, globally or per op (empty = adaptive selection); or, for a
    value of the executor grammar, its entries (`executors`) and why the legacy grammar refused it."""
    global_levels: tuple = ()
    per_op: tuple = ()
    text: str = ""
    executors: tuple | None = None      # config.alg_parse.ExecutorEntry, when the value is of that grammar
    legacy_error: str = ""              # the legacy grammar's complaint about such a value

    def levels_for(self, op: str) -> dict:
        """level -> token for collective `op` ("allreduce", ...); {} when nothing is configured.
        E_NOT_SUPPORT for a value of the executor grammar: it has no levels to give."""
        if self.executors is not None:
            raise self.not_read_by("this device", "level0:NA;level1:<algo>")
        if self.global_levels:
            return dict(self.global_levels)
        table = dict(self.per_op)
        if op in table:
            return dict(table[op])
        if "others" in table:
            return dict(table["others"])
        return {}

    def __bool__(self):
        return bool(self.global_levels or self.per_op or self.executors)

    def not_read_by(self, device: str, grammar: str) -> HcclError:
        """E_NOT_SUPPORT: this executor-grammar value on a device whose HCCL reads `grammar` only."""
        return HcclError("E_NOT_SUPPORT", f"HCCL_ALGO={self.text!r} names executors of the open-source HCCL's "
                         f"grammar ({describe(self.executors)}), which HCCL reads on the Ascend 950; HCCL on "
                         f"{device} reads {grammar} only ({self.legacy_error})")


def _parse_levels(text: str, source: str, value: str, per_op: bool) -> tuple:
    levels = {}
    entries = text.split(";")
    if len(entries) > MAX_LEVELS:
        raise _error(source, value, f"{len(entries)} level entries in {text!r}; at most {MAX_LEVELS}")
    for entry in entries:
        if entry == "":
            raise _error(source, value, f"empty level entry in {text!r} (leading, trailing or doubled ';')")
        level, sep, token = entry.partition(":")
        if not sep:
            raise _error(source, value, f"entry {entry!r} is not level<N>:<algo>")
        if level not in ("level0", "level1", "level2", "level3"):
            raise _error(source, value, f"unknown level {level!r}; levels are level0..level3")
        if level in levels:
            raise _error(source, value, f"{level} is given twice")
        if token not in ALGO_TOKENS:
            raise _error(source, value, f"unknown algorithm {token!r} (tokens are case-sensitive: "
                         f"{', '.join(ALGO_TOKENS)})")
        if per_op and level == "level0" and token == "null":
            raise _error(source, value, "level0 may not be null in a per-op configuration")
        levels[level] = token
    return tuple(sorted(levels.items()))


def parse_hccl_algo(value: str, source: str = "HCCL_ALGO") -> AlgoConfig:
    if not isinstance(value, str):
        raise _error(source, str(value), "not a string")
    value = "".join(value.split(" "))          # HCCL removes every space before it parses
    if value == "":
        return AlgoConfig()
    try:
        return _parse_legacy(value, source)
    except HcclError as legacy:
        try:
            entries = parse_executor_config(value)
        except HcclError as executor:
            raise HcclError("E_PARA", f"{legacy.reason}; nor is it of the executor grammar "
                            f"({executor.reason.partition(' is invalid: ')[2]})") from None
        return AlgoConfig(text=value, executors=entries, legacy_error=legacy.reason)


def _parse_legacy(value: str, source: str) -> AlgoConfig:
    parts = value.split("/")
    with_op = ["=" in part for part in parts if part]
    if any(with_op) and not all(with_op):
        raise _error(source, value, "the global form and the per-op form are mixed")
    if not any(with_op):
        if "" in parts and len(parts) > 1:
            raise _error(source, value, "empty op entry (leading, trailing or doubled '/')")
        if len(parts) > 1:
            raise _error(source, value, "more than one global configuration")
        return AlgoConfig(global_levels=_parse_levels(value, source, value, per_op=False), text=value)
    per_op = {}
    for part in parts:
        if part == "":
            raise _error(source, value, "empty op entry (leading, trailing or doubled '/')")
        op, _, levels = part.partition("=")
        if op not in OP_NAMES:
            raise _error(source, value, f"unknown op {op!r}; ops are {', '.join(OP_NAMES)}")
        if op in per_op:
            raise _error(source, value, f"op {op!r} is configured twice")
        per_op[op] = _parse_levels(levels, source, value, per_op=True)
    return AlgoConfig(per_op=tuple(sorted(per_op.items())), text=value)
