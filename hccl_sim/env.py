"""HCCL environment variables, parsed and validated once when a communicator is created.

Each variable follows HCCL's documented syntax and range (reference/hccl.md §3); a malformed value
is an HcclError (E_PARA, HCCL's EI0001) naming the variable, the value and the expected form.
Values come from `env={...}` given to run/Cluster/simulate, falling back to os.environ.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from topologies.errors import HcclError

from .algo_config import AlgoConfig, parse_hccl_algo

MB = 1 << 20


def _bad(var, value, expected):
    return HcclError("E_PARA", f"environment variable {var}={value!r} is invalid; expected {expected}")


def _int_in(var, value, lo, hi):
    text = value.strip()
    if not re.fullmatch(r"\d+", text):
        raise _bad(var, value, f"an integer in [{lo}, {hi}]")
    v = int(text)
    if not lo <= v <= hi:
        raise _bad(var, value, f"an integer in [{lo}, {hi}]")
    return v


def parse_retry_enable(value: str) -> dict:
    """HCCL_OP_RETRY_ENABLE, e.g. "L1:0,L2:1" (L0 accepted as in HCCL)."""
    expected = '"L1:<0|1>,L2:<0|1>" (e.g. "L1:1,L2:0")'
    out = {}
    for part in value.split(","):
        m = re.fullmatch(r"\s*(L[012])\s*:\s*([01])\s*", part)
        if not m or m.group(1) in out:
            raise _bad("HCCL_OP_RETRY_ENABLE", value, expected)
        out[m.group(1)] = m.group(2) == "1"
    return out


def parse_retry_params(value: str) -> dict:
    """HCCL_OP_RETRY_PARAMS, e.g. "MaxCnt:1,HoldTime:5000,IntervalTime:1000"."""
    expected = '"MaxCnt:<1-10>,HoldTime:<0-60000 ms>,IntervalTime:<0-60000 ms>"'
    ranges = {"MaxCnt": (1, 10), "HoldTime": (0, 60000), "IntervalTime": (0, 60000)}
    out = {}
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\w+)\s*:\s*(\d+)\s*", part)
        if not m or m.group(1) not in ranges or m.group(1) in out:
            raise _bad("HCCL_OP_RETRY_PARAMS", value, expected)
        lo, hi = ranges[m.group(1)]
        v = int(m.group(2))
        if not lo <= v <= hi:
            raise _bad("HCCL_OP_RETRY_PARAMS", value, expected)
        out[m.group(1)] = v
    return out


@dataclass(frozen=True)
class Config:
    """The HCCL settings one communicator runs with."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    buffsize_mb: int = 200
    exec_timeout_s: int = 1836
    connect_timeout_s: int = 120
    retry_enable: tuple = (("L1", False), ("L2", False))
    retry_params: tuple = (("MaxCnt", 1), ("HoldTime", 5000), ("IntervalTime", 1000))
    deterministic: str = "false"
    policy: str = "hccl"          # algorithm selection: "hccl" (HCCL's rules) or "model" (fastest modelled)

    @property
    def buffsize_bytes(self) -> int:
        return self.buffsize_mb * MB

    @property
    def wait_timeout_s(self):
        """Wall-clock deadline of every wait on a peer; HCCL_EXEC_TIMEOUT=0 means never."""
        return self.exec_timeout_s or None

    @classmethod
    def from_env(cls, env: dict | None = None, policy: str | None = None) -> "Config":
        merged = {k: v for k, v in os.environ.items() if k.startswith("HCCL_")}
        for k, v in (env or {}).items():
            if not isinstance(k, str) or not k.startswith("HCCL_"):
                raise HcclError("E_PARA", f"env: {k!r} is not an HCCL_* variable")
            merged[k] = str(v)
        kw = {}
        if "HCCL_ALGO" in merged:
            kw["algo"] = parse_hccl_algo(merged["HCCL_ALGO"])
        if "HCCL_BUFFSIZE" in merged:
            kw["buffsize_mb"] = _int_in("HCCL_BUFFSIZE", merged["HCCL_BUFFSIZE"], 1, 1 << 20)
        if "HCCL_EXEC_TIMEOUT" in merged:
            kw["exec_timeout_s"] = _int_in("HCCL_EXEC_TIMEOUT", merged["HCCL_EXEC_TIMEOUT"], 0, 2147483647)
        if "HCCL_CONNECT_TIMEOUT" in merged:
            kw["connect_timeout_s"] = _int_in("HCCL_CONNECT_TIMEOUT", merged["HCCL_CONNECT_TIMEOUT"], 120, 7200)
        if "HCCL_OP_RETRY_ENABLE" in merged:
            kw["retry_enable"] = tuple(sorted(parse_retry_enable(merged["HCCL_OP_RETRY_ENABLE"]).items()))
        if "HCCL_OP_RETRY_PARAMS" in merged:
            params = dict(cls.retry_params)
            params.update(parse_retry_params(merged["HCCL_OP_RETRY_PARAMS"]))
            kw["retry_params"] = tuple(sorted(params.items()))
        if "HCCL_DETERMINISTIC" in merged:
            v = merged["HCCL_DETERMINISTIC"].strip().lower()
            if v not in ("false", "true", "strict"):
                raise _bad("HCCL_DETERMINISTIC", merged["HCCL_DETERMINISTIC"], "false, true or strict")
            kw["deterministic"] = v
        if policy is not None:
            if policy not in ("hccl", "model"):
                raise HcclError("E_PARA", f"policy {policy!r} is invalid; expected hccl or model")
            kw["policy"] = policy
        return cls(**kw)
