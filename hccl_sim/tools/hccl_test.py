"""`hccl-sim bench --format hccl_test`: hccl_test's options, checks, sizes and output, as its source has them.

Read in hicann/oam-tools at ea0ce91 (docs/references.md §11.5), `src/hccl_test/`:
- options and defaults (`common/src/hccl_test_common.h`, `.cc`): -b and -e 64M, -i (stepbytes)
  by default (e - b) / 10 (1 when e = b), -f a float factor that wins over -i, -n 20, -w 10, -c 1,
  -o sum, -d fp32, -r 0, -p the node's NPUs, -z 0; sizes parsed by `parsesize` (strtol base 0 and
  one K/M/G letter), counts by `strtol_alldigit` (digits only, base 0: 010 is 8);
- the checks in `check_cmd_line`'s order and its messages, printed here as the one line of an
  HcclError (hccl_test prints them and exits with "This is an error in check_cmd_line.");
- the sizes: `opbase_test_by_data_size`'s loop, with `check_data_count`'s rank-size alignment for
  the block binaries; each binary's element count (`init_malloc_Ksize_by_data`);
- the output (`common/src/hccl_opbase_rootinfo_base.cc`, `print_execution_time`): the first line,
  the header `%-15s | %-12s | %-18s | %s` and rows `%-17llu | %-14.2f | %-20.5f | <result>`,
  printed by the root rank (-r) with its own time; failing ranks' "local rank_id" lines; a rank's
  failure sticks for the rest of the sweep (check_err is never reset).

hccl-sim's own rules on top (each a one-line refusal): -n 0 (hccl_test divides by it), -c 2 (its
verbose per-element lines are not emulated), a sweep that never ends (-i 0, or a step of 0), hif8
and int128 (no numpy type), -p other than the topology's NPUs per server, -z 1 off A3 or on an op
zero-copy does not cover. The check rule itself is hccl_sim.tools.hccl_test_data.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from topologies.errors import HcclError

from .. import canonical_op
from ..config.types import check_type, dtype_name, numpy_dtype
from . import hccl_test_data as data
from .bench import MAX_SIZES, BenchSpec, run_bench

KILO, MEGA, GIGA = 1024, 1024 ** 2, 1024 ** 3
TYPE_NAMES = ("int8", "int16", "int32", "fp16", "fp32", "int64", "uint64", "uint8", "uint16", "uint32", "fp64",
              "bfp16", "int128", "hif8", "fp8e4m3", "fp8e5m2", "fp8e8m0")
"""test_typenames: the -d names, exact and case-sensitive (strcmp)."""
REDOPS = ("sum", "prod", "max", "min")
BINARIES = {"allreduce": "all_reduce_test", "allgather": "all_gather_test", "allgatherv": "all_gatherv_test",
            "reducescatter": "reduce_scatter_test", "reducescatterv": "reduce_scatterv_test",
            "broadcast": "broadcast_test", "reduce": "reduce_test", "scatter": "scatter_test",
            "alltoall": "alltoall_test", "alltoallv": "alltoallv_test", "alltoallvc": "alltoallvc_test"}
ALIGNED = ("allgather", "allgatherv", "alltoall", "alltoallv", "alltoallvc", "reducescatter", "reducescatterv",
           "scatter")
"""Binaries with need_ranksize_alignment (their init_opbase_ptr)."""
BLOCKS = ("allgather", "allgatherv", "reducescatter", "reducescatterv", "scatter")
"""Binaries whose count is one rank's block: ceil(count / p) (their bandwidth: the block times p)."""
ALLTOALLS = ("alltoall", "alltoallv", "alltoallvc")
BUF_ALIGN_SIZE, BUF_ALIGN_LINE, GRANULARITY = 512, 16 * MEGA, 128
ZERO_COPY_OPS = ("allreduce", "reducescatter", "allgather", "broadcast")
"""The tests HCCL's zero-copy covers (docs/zh/hccl_test/cmdline_options_desc.md, -z)."""
OP_IGNORED = "Warning: The -o,--op <sum/prod/min/max> option does not take effect. Check the cmd parameter."
DIGITS = "Error:In judge all digit, Check whether the value of [-i -n -r -w -c -p] is a positive integer."


def strtol(text: str, base: int = 0):
    """C's strtol: (value, the rest of the text). Leading spaces, a sign, 0x or 0 for base 0."""
    m = re.match(r"\s*([+-]?)(0[xX](?=[0-9a-fA-F])|0(?=[0-7]))?", text)
    sign, prefix = m.group(1), (m.group(2) or "").lower()
    b = base or (16 if prefix == "0x" else 8 if prefix == "0" else 10)
    digits = {16: "0-9a-fA-F", 8: "0-7", 10: "0-9"}[b]
    d = re.match(f"[{digits}]+", text[m.end():])
    if not d:
        return 0, text                       # no number: nothing read
    value = int(d.group(0), b)
    return (-value if sign == "-" else value), text[m.end() + d.end():]


def parsesize(text: str) -> int:
    """hccl_test's parsesize: -1 unless a number is followed by nothing or one of KkMmGg."""
    size, rest = strtol(text)
    units = {"": 1, "k": KILO, "m": MEGA, "g": GIGA}.get(rest.lower() if len(rest) <= 1 else "x")
    return -1 if units is None else size * units


def strtol_alldigit(text: str):
    """(value, message): -1 with hccl_test's message unless every character is a digit."""
    if not text.isascii() or not all(c.isdigit() for c in text):
        return -1, DIGITS
    return strtol(text)[0], None


def strtof(text: str) -> float:
    """C's strtof, as far as a step factor needs it: the leading decimal number, float precision."""
    m = re.match(r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)", text)
    return float(np.float32(float(m.group(0)))) if m else 0.0


def stoi(text: str) -> int:
    """std::stoi: a leading decimal integer, else the uncaught exception that ends hccl_test."""
    m = re.match(r"\s*[+-]?\d+", text)
    if not m:
        raise HcclError("E_PARA", "terminate called after throwing an instance of 'std::invalid_argument' "
                        "what():  stoi")
    value = int(m.group(0))
    if not -2 ** 31 <= value < 2 ** 31:
        raise HcclError("E_PARA", "terminate called after throwing an instance of 'std::out_of_range' "
                        "what():  stoi")
    return value


@dataclasses.dataclass
class Options:
    """hccl_test's settings after parse_cmd_line (its member defaults where an option is absent)."""
    minbytes: int = 64 * MEGA
    maxbytes: int = 64 * MEGA
    stepbytes: int | None = None        # -i, when given (stepbytes_flag)
    stepfactor: float | None = None     # -f, when given (stepfactor_flag)
    iters: int = 20
    warmup: int = 10
    redop: str | None = "sum"           # None: -o named no reduce op (get_hccl_op_from_str's -1)
    redop_given: bool = False           # op_flag
    dtype: str | None = "fp32"          # the -d name; None: not one of TYPE_NAMES
    root: int = 0
    check: int = 1
    npus: int | None = None             # -p; None: the node's NPUs
    zero_copy: int = 0
    messages: list = dataclasses.field(default_factory=list)    # printed while parsing, in order


def parse(args) -> Options:
    """Options from the CLI's strings (None: not given), converted as parse_opt converts them."""
    o = Options()

    def digits(text):
        value, message = strtol_alldigit(text)
        if message:
            o.messages.append(message)
        return value
    if args.minbytes is not None:
        o.minbytes = parsesize(args.minbytes)
    if args.maxbytes is not None:
        o.maxbytes = parsesize(args.maxbytes)
    if args.stepbytes is not None:
        o.stepbytes = digits(args.stepbytes)
    if args.stepfactor is not None:
        o.stepfactor = strtof(args.stepfactor)
    if args.iters is not None:
        o.iters = digits(args.iters)
    if args.redop is not None:
        o.redop, o.redop_given = (args.redop if args.redop in REDOPS else None), True
    if args.datatype is not None:
        o.dtype = args.datatype if args.datatype in TYPE_NAMES else None
    for flag in ("root", "warmup_iters", "check", "npus_per_node"):
        text = getattr(args, flag)
        if text is not None:
            setattr(o, {"warmup_iters": "warmup", "npus_per_node": "npus"}.get(flag, flag), digits(text))
    if args.zero_copy is not None:
        o.zero_copy = stoi(args.zero_copy)
    return o


def _fail(message: str, code: str = "E_PARA"):
    raise HcclError(code, message)


def check(o: Options, op: str, topo) -> list:
    """check_cmd_line, in its order; then hccl-sim's own refusals. Returns the warnings hccl_test
    prints for settings it accepts."""
    if o.messages:                       # parse_opt printed these first
        _fail(o.messages[0])
    if o.minbytes <= 0 or o.maxbytes <= 0:
        _fail("invalid size specified for [-b,--minbytes] or [-e,--maxbytes]")
    if o.stepbytes is not None and o.stepbytes < 0:
        _fail("Error: [-i,--stepbytes] must be greater than or equal to 0.")
    if o.maxbytes < o.minbytes:
        _fail("invalid option: maxbytes < minbytes, Check the [-b,--minbytes] and [-e,--maxbytes] options.")
    if o.stepfactor is not None and o.stepfactor <= 1.0:
        _fail("Error: [-f,--stepfactor] Must be greater than 1.0f, Start step mod.")
    warnings = []
    if o.stepfactor is not None and o.stepbytes is not None:
        warnings.append("Warning: [-f,--stepfactor] and [-i,--stepbytes] are set, [-f,--stepfactor] is enabled by "
                        "default.")
    if o.dtype is None:
        _fail("Error: [-d,--datatype] is invalid, Use [-h,--help] to check the correct input parameter.")
    if o.redop is None:
        _fail("Error: [-o,--op] is invalid, Use [-h,--help] to check the correct input parameter.")
    if o.warmup < 0:
        _fail("Error: [-w,--warmup_iters] is invalid, warmup_iters must be greater than or equal to 0.")
    if o.iters < 0:
        _fail("Error: [-n,--iters] is invalid, iters must be greater than or equal to 0.")
    p = topo.num_ranks
    if not 0 <= o.root < p:
        _fail("Error: [-r,--root <root>] is invalid, root rank must be greater than or equal to 0 and less than or "
              f"equal to {p - 1}.")
    if not 0 <= o.check <= 2:
        _fail("Error: [-c,--check] is invalid, check should be 0 or 1 or 2")
    per_server = sorted({len(topo.ranks_of_server(s)) for s in set(topo.server_of)})
    dev_count = per_server[-1]
    if o.npus is not None and not 1 <= o.npus <= dev_count:
        _fail("Error: [-p,--npus <npus used for one node>] is invalid, npus must be greater than or equal to 1 and "
              f"less than or equal to {dev_count}.")
    # ---- hccl-sim's rules ------------------------------------------------------------------------
    if o.npus is not None and per_server != [o.npus]:
        _fail(f"-p {o.npus}: the topology has {per_server} NPUs per server (hccl-sim runs every NPU of its servers)")
    if o.iters == 0:
        _fail("-n 0: hccl_test accepts it but divides its elapsed time by 0 iterations (avg_time inf or nan); "
              "hccl-sim needs -n >= 1")
    if o.check == 2:
        _fail("-c 2: hccl_test's verbose check (the first wrong element's position and values on every failing "
              "rank) is not emulated; use -c 1")
    if o.dtype == "int128":
        _fail("-d int128: hccl_test has no int128 case (its type switch sizes an int128 element as the default's "
              "4 bytes and writes no input of it; hccl_opbase_rootinfo_base.cc, hccl_check_buf_init.cc): not emulated",
              "E_NOT_SUPPORT")
    # what HCCL's own checks refuse on the device, as the op's call would fail (type_rules)
    check_type(o.dtype, topo.device_model.data_types, BINARIES[op], o.redop if op in data.REDUCING else None)
    if o.zero_copy:
        _zero_copy_allowed(op, topo)
    return warnings


def _zero_copy_allowed(op: str, topo) -> None:
    """-z 1: only on A3, only where it changes something hccl-sim models."""
    if topo.device != "910C":
        _fail("-z 1: zero-copy is supported on Atlas A3 training and inference products only "
              f"(docs/zh/hccl_test/cmdline_options_desc.md); the topology's NPU is {topo.device}", "E_NOT_SUPPORT")
    if op not in ZERO_COPY_OPS + ("alltoall",):
        _fail(f"-z 1: HCCL's zero-copy covers {', '.join(BINARIES[o] for o in ZERO_COPY_OPS)} only "
              f"(docs/zh/hccl_test/cmdline_options_desc.md), and {BINARIES[op]}'s sizes do not depend on it",
              "E_NOT_SUPPORT")


def align(nbytes: int, p: int) -> int:
    """check_data_count's align_bytes: at least p bytes; a multiple of p, or above 16 MiB of p x 512."""
    nbytes = max(nbytes, p)
    unit = p * BUF_ALIGN_SIZE if nbytes > BUF_ALIGN_LINE else p
    return nbytes // unit * unit


def data_sizes(o: Options, op: str, p: int):
    """(min, max, the sweep's data sizes) as opbase_test_by_data_size loops over them."""
    lo, hi = o.minbytes, o.maxbytes
    step = o.stepbytes if o.stepbytes is not None else (1 if hi == lo else (hi - lo) // 10)
    if op in ALIGNED:
        lo, hi, step = align(lo, p), align(hi, p), -(-step // p) * p
    factor = o.stepfactor if o.stepfactor is not None else 1.0
    out, s = [], lo
    while s <= hi:
        out.append(s)
        nxt = s + step if factor <= 1.0 else int(s * factor)    # u64 *= double truncates
        if nxt <= s:
            how = f"-f {factor:g} leaves {s} B as it is" if factor > 1.0 else f"it adds {step} B a step"
            _fail(f"hccl_test would repeat {s} B forever ({how}); hccl-sim needs a sweep that ends: give -e > -b "
                  "with a step of at least 1 byte, or -f")
        if len(out) > MAX_SIZES:
            _fail(f"the sweep has over {MAX_SIZES} sizes (hccl_sim.tools.bench.MAX_SIZES): use a larger -i or -f")
        s = nxt
    return lo, hi, out


def op_bytes(op: str, data_size: int, p: int, itemsize: int, zero_copy: bool) -> int:
    """The bytes hccl_test's bandwidth divides (malloc_kSize, times p for the block binaries),
    which is the op's size as hccl-sim's bench counts it."""
    count = -(-data_size // itemsize)                      # init_data_count rounds up
    if op in BLOCKS:
        return -(-count // p) * p * itemsize
    if op in ALLTOALLS:
        unit = p * GRANULARITY if count >= p * GRANULARITY or (zero_copy and op == "alltoall") else p
        return -(-count // unit) * unit * itemsize
    return count * itemsize


def average_us(total_ns: int, iters: int) -> float:
    """aclrtEventElapsedTime's float milliseconds, times 1000 in float, over iters in double."""
    ms = np.float32(total_ns / 1e6)
    return float(np.float32(ms * np.float32(1000))) / iters


def row_text(data_size: int, avg_us: float, bandwidth: float, result: str) -> str:
    return f"{data_size:<17d} | {avg_us:<14.2f} | {bandwidth:<20.5f} | {result}"


def _bandwidth(nbytes: int, avg_us: float) -> float:
    """malloc_kSize / average_time_us * B_US_TO_GB_S, with C's division by zero (inf, or nan for 0/0)."""
    if avg_us > 0:
        return nbytes / avg_us * 1e-3
    return math.inf if nbytes else math.nan


HEADER = f"{'data_size(Bytes):':<15s} | {'aveg_time(us):':<12s} | {'alg_bandwidth(GB/s):':<18s} | check_result:"


def run(args, topo, spec_kwargs: dict, out=print) -> tuple:
    """The sweep in hccl_test's mode; prints as hccl_test's root rank would. Returns the BenchSpec
    and its Rows."""
    op = canonical_op(args.op)
    if op not in BINARIES:
        _fail(f"--format hccl_test: hccl_test has no binary for {op} (it has {', '.join(BINARIES.values())})")
    if args.counts is not None:
        _fail("--counts: hccl_test's V binaries split every size evenly among the ranks; drop --counts")
    o = parse(args)
    warnings = check(o, op, topo)
    p, dtype = topo.num_ranks, dtype_name(o.dtype)
    lo, hi, sizes = data_sizes(o, op, p)
    itemsize = numpy_dtype(dtype).itemsize
    if o.zero_copy and op in ZERO_COPY_OPS:     # HCCL reads and writes the user's buffers: no staging copies
        topo.device_model = dataclasses.replace(topo.device_model, staging=False)
    skipped = data.unchecked(op, dtype, o.redop, p)
    spec = BenchSpec(op=op, sizes=[op_bytes(op, s, p, itemsize, bool(o.zero_copy)) for s in sizes], dtype=dtype,
                     redop=o.redop, root=o.root, iters=o.iters, warmup=o.warmup,
                     check=bool(o.check) and skipped is None, check_rule="hccl_test", **spec_kwargs)
    state = {"rows": 0, "failed": set()}
    for line in warnings:
        out(line)

    def progress(row):
        i = state["rows"]
        state["rows"] += 1
        if i == 0:
            out(f"the minbytes is {lo}, maxbytes is {hi}, iters is {o.iters}, warmup_iters is {o.warmup}")
        if o.redop_given and op not in data.REDUCING:
            out(OP_IGNORED)
        if i == 0 and skipped:           # no_verification prints it whatever -c says
            out(skipped)
        times = row.rank_ns or (0,) * p
        bandwidth = [_bandwidth(row.size, average_us(t, o.iters)) for t in times]
        if spec.check and row.rank_wrong is not None:
            for r, n in enumerate(row.rank_wrong):
                if n:
                    if dtype not in data.CHECKED.get(op, (dtype,)):
                        out("no match datatype")
                    elif op not in ALLTOALLS:
                        out(f"total err is {n}")
                    state["failed"].add(r)
            for r in sorted(state["failed"]):
                out(f"local rank_id {r}, check result failed, "
                    + row_text(sizes[i], average_us(times[r], o.iters), bandwidth[r], "failed"))
        if i == 0:
            out(HEADER)
        result = ("NULL" if not spec.check or row.rank_wrong is None
                  else "failed" if o.root in state["failed"] else "success")
        out(row_text(sizes[i], average_us(times[o.root], o.iters), bandwidth[o.root], result))
    return spec, run_bench(spec, topo, progress=progress)
