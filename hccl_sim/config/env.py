"""HCCL environment variables, parsed and validated once when a communicator is created.

Each variable follows HCCL's documented syntax and range (docs/references.md §7); a malformed value
is an HcclError (E_PARA, HCCL's EI0001) naming the variable, the value and the expected form.
Values come from `env={...}` given to run/Cluster/simulate, falling back to os.environ.
"""
from __future__ import annotations

import difflib
import os
import re
import warnings
from typing import Optional
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass, field

from topologies.errors import HcclError

from .hccl_algo import AlgoConfig, parse_hccl_algo

MB = 1 << 20


def _bad(var, value, expected):
    return HcclError("E_PARA", f"environment variable {var}={_short(value)} is invalid; expected {expected}")


def _int_in(var, value, lo, hi):
    text = value.strip()
    # ASCII digits only (\d would take "٣"), and no longer than `hi` (int() refuses 4,300 digits)
    if not re.fullmatch(r"[0-9]+", text) or len(text.lstrip("0")) > len(str(hi)):
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
        m = re.fullmatch(r"\s*(\w+)\s*:\s*([0-9]{1,9})\s*", part)
        if not m or m.group(1) not in ranges or m.group(1) in out:
            raise _bad("HCCL_OP_RETRY_PARAMS", value, expected)
        lo, hi = ranges[m.group(1)]
        v = int(m.group(2))
        if not lo <= v <= hi:
            raise _bad("HCCL_OP_RETRY_PARAMS", value, expected)
        out[m.group(1)] = v
    return out


EXPANSION_MODES = ("AI_CPU", "AICPU_TS", "AICPU_CacheDisable", "AIV", "HOST", "HOST_TS", "CCU_MS", "CCU_SCHED")
"""HCCL_OP_EXPANSION_MODE's values, case-sensitive (alg_env_config.cc ParseOpExpansion, §7.2;
defaults: A2 HOST, A3 AI_CPU, 950 AICPU_TS)."""
MODELLED = ("HCCL_ALGO", "HCCL_BUFFSIZE", "HCCL_EXEC_TIMEOUT", "HCCL_CONNECT_TIMEOUT", "HCCL_OP_RETRY_ENABLE",
            "HCCL_OP_RETRY_PARAMS", "HCCL_DETERMINISTIC", "HCCL_INTER_HCCS_DISABLE",
            "HCCL_RDMA_TIMEOUT", "HCCL_RDMA_RETRY_CNT", "HCCL_OP_EXPANSION_MODE", "HCCL_BIRS_ENABLE",
            "HCCL_USE_NEW_SELECTOR",
            "HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO")
"""The HCCL variables hccl-sim reads."""
NOT_MODELLED = (
    "HCCL_ASYNC_ERROR_HANDLING", "HCCL_BLOCKING_WAIT",
    "HCCL_DEBUG_CONFIG", "HCCL_DESYNC_DEBUG", "HCCL_DFS_CONFIG", "HCCL_DIAGNOSE_ENABLE", "HCCL_ENTRY_LOG_ENABLE",
    "HCCL_EVENT_TIMEOUT", "HCCL_FFTS_CAPACITY", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_IF_BASE_PORT", "HCCL_IF_IP",
    "HCCL_INDEPENDENT_OP", "HCCL_INTER_SERVER_RING_ALGO_MAX_SUPPORT_SERVER_NUM", "HCCL_INTRA_PCIE_ENABLE",
    "HCCL_INTRA_ROCE_ENABLE", "HCCL_LOGIC_SUPERPOD_ID", "HCCL_LOST_THRESHOLD", "HCCL_MEMSIZE_HD_FACTOR",
    "HCCL_MULTI_QP_THRESHOLD", "HCCL_NPU_SOCKET_PORT_RANGE", "HCCL_RDMA_QPS_PER_CONNECTION",
    "HCCL_RDMA_SL", "HCCL_RDMA_TC", "HCCL_SOCKET_FAMILY",
    "HCCL_SOCKET_IFNAME", "HCCL_WHITELIST_DISABLE", "HCCL_WHITELIST_FILE")
"""HCCL variables of the real library (docs/references.md §7.3) that hccl-sim accepts and ignores."""


RAW_ENV = ("HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO",)
"""Variables HCCL reads with std::getenv rather than GetEnv: set to "", they are set (and invalid)."""
_NON_NEGATIVE = re.compile(r"[0-9]+(\.[0-9]+)?")     # alg_env_config.cc IsValidNumberFormat


def check_env(env) -> dict:
    """Validate an `env=` mapping: string HCCL_* keys and string values (as in os.environ).
    An empty value is left out: HCCL reads "" as unset (alg_env_config.cc GetEnv, §7.2), except
    where HCCL reads the variable raw (RAW_ENV), for which "" is a value like any other.

    A key that is no HCCL variable hccl-sim or HCCL knows is most likely misspelt: it is kept (it
    cannot change anything) but warned about, naming the closest known variable; a real HCCL
    variable that hccl-sim does not model is warned about as ignored."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise HcclError("E_PARA", f"env must be a dict of HCCL_* variable names to string values, "
                        f"got {type(env).__name__} {_short(env)}")
    out = {}
    for k, v in env.items():
        if not isinstance(k, str):
            raise HcclError("E_PARA", f"env: key {_short(k)} ({type(k).__name__}) is not a variable name; "
                            "keys are strings such as 'HCCL_BUFFSIZE'")
        if not k.startswith("HCCL_"):
            raise HcclError("E_PARA", f"env: {k!r} is not an HCCL_* variable")
        if not isinstance(v, str):
            raise HcclError("E_PARA", f"env: {k}={_short(v)} ({type(v).__name__}) must be a string, as in the "
                            f"process environment (e.g. {k}='{v!s:.20}')")
        if k not in MODELLED:
            if k in NOT_MODELLED:
                warnings.warn(f"env: {k} is an HCCL variable that hccl-sim does not model; it is ignored",
                              UserWarning, stacklevel=4)
            else:
                close = difflib.get_close_matches(k, MODELLED + NOT_MODELLED, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else f"; hccl-sim reads {', '.join(MODELLED)}"
                warnings.warn(f"env: unknown HCCL variable {k} is ignored{hint}", UserWarning, stacklevel=4)
        if v != "" or k in RAW_ENV:
            out[k] = v
    return out


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
    rdma_timeout: int = 20             # retransmit every 4.096 us x 2^this (checked per device when faults bind)
    rdma_retry_cnt: int = 7            # retransmissions before an error CQE
    faults: object = None              # hccl_sim.faults.fault_plan.BoundFaults of the run, or None
    inter_hccs_disable: bool = False   # A3: RoCE instead of the UB (HCCS) fabric between a superpod's servers
    expansion: Optional[str] = None    # HCCL_OP_EXPANSION_MODE (EXPANSION_MODES); None: the device's default
    birs: bool = False                 # HCCL_BIRS_ENABLE=TRUE: A3's batch-invariant ReduceScatter (§6.12)
    split_ratio: Optional[float] = None   # HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO: the 950's Parallel split
    new_selector: bool = False    # HCCL_USE_NEW_SELECTOR=1: the 950's cost-model selection of AllReduce, RS, AG
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
        merged = {k: v for k, v in os.environ.items() if k.startswith("HCCL_") and (v != "" or k in RAW_ENV)}
        merged.update(check_env(env))
        return cls(**_settings(cls, merged, policy))

    def with_env(self, env: dict | None) -> "Config":
        """These settings with the variables `env` gives changed (a sub-communicator's own
        HcclCommConfig, as its env-style names); the process environment is not read again."""
        env = check_env(env)
        return dataclasses.replace(self, **_settings(self, env, None)) if env else self


def _settings(base, merged: dict, policy) -> dict:
    """Config's fields that the HCCL_* variables in `merged` (and `policy`) set, on top of `base`
    (the class's defaults, or a communicator's settings)."""
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
        params = dict(base.retry_params)
        params.update(parse_retry_params(merged["HCCL_OP_RETRY_PARAMS"]))
        kw["retry_params"] = tuple(sorted(params.items()))
    if "HCCL_DETERMINISTIC" in merged:
        v = merged["HCCL_DETERMINISTIC"].strip().lower()
        if v not in ("false", "true", "strict"):
            raise _bad("HCCL_DETERMINISTIC", merged["HCCL_DETERMINISTIC"], "false, true or strict")
        kw["deterministic"] = v
    if "HCCL_RDMA_TIMEOUT" in merged:
        # A2/A3 [5, 20], 910A [5, 24] (docs/references.md §7.2); the device's own range is checked when faults bind
        kw["rdma_timeout"] = _int_in("HCCL_RDMA_TIMEOUT", merged["HCCL_RDMA_TIMEOUT"], 5, 24)
    if "HCCL_RDMA_RETRY_CNT" in merged:
        kw["rdma_retry_cnt"] = _int_in("HCCL_RDMA_RETRY_CNT", merged["HCCL_RDMA_RETRY_CNT"], 1, 7)
    if "HCCL_INTER_HCCS_DISABLE" in merged:
        # externalinput.cc ParseInterLinkType: TRUE or FALSE, any case
        v = merged["HCCL_INTER_HCCS_DISABLE"].strip().upper()
        if v not in ("TRUE", "FALSE"):
            raise _bad("HCCL_INTER_HCCS_DISABLE", merged["HCCL_INTER_HCCS_DISABLE"], "TRUE or FALSE")
        kw["inter_hccs_disable"] = v == "TRUE"
    if "HCCL_OP_EXPANSION_MODE" in merged:
        # where HCCL expands an op (§7.2), compared as written, as HCCL compares it; selection
        # says which the device models
        v = merged["HCCL_OP_EXPANSION_MODE"]
        if v not in EXPANSION_MODES:
            raise _bad("HCCL_OP_EXPANSION_MODE", v, f"one of {', '.join(EXPANSION_MODES)} (case-sensitive)")
        kw["expansion"] = v
    if "HCCL_BIRS_ENABLE" in merged:
        # MatchBIRS (reduce_scatter_op_experimental.cc): exactly "TRUE" turns it on and anything
        # else leaves it off, without an error; RFC 0001's values are TRUE and FALSE (§6.12)
        v = merged["HCCL_BIRS_ENABLE"]
        if v not in ("TRUE", "FALSE"):
            warnings.warn(f"HCCL_BIRS_ENABLE={_short(v)} leaves BIRS off: HCCL turns it on for exactly 'TRUE'",
                          UserWarning, stacklevel=4)
        kw["birs"] = v == "TRUE"
    if "HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO" in merged:
        # ParseMultipleDimensionSplitRatio (alg_env_config.cc): digits with an optional fraction,
        # else init fails (EI0001, "a non-negative number"); SetMultipleDimensionSplitRatio
        # (op_common.cc) takes a value above 1 as 0.5, with a warning (§6.13)
        v = merged["HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO"]
        if not _NON_NEGATIVE.fullmatch(v):
            raise _bad("HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO", v, "a non-negative number")
        ratio = float(v)
        if ratio > 1.0:
            warnings.warn(f"HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO={_short(v)} is out of range [0, 1]: HCCL uses "
                          "the default ratio 0.5", UserWarning, stacklevel=4)
            ratio = 0.5
        kw["split_ratio"] = ratio
    if "HCCL_USE_NEW_SELECTOR" in merged:
        # ParseNewSelector (alg_env_config.cc): exactly "0" or "1", else init fails (§7.2)
        v = merged["HCCL_USE_NEW_SELECTOR"]
        if v not in ("0", "1"):
            raise _bad("HCCL_USE_NEW_SELECTOR", v, "0 or 1")
        kw["new_selector"] = v == "1"
    if policy is not None:
        if not isinstance(policy, str) or policy not in ("hccl", "model"):
            raise HcclError("E_PARA", f"policy {policy!r} is invalid; expected hccl or model")
        kw["policy"] = policy
    return kw
