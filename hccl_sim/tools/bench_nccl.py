"""`hccl-sim bench` in its default format: nccl-tests' table (docs/references.md §11.3).

The options the two formats share arrive as text (hccl_sim.tools.cli); this mode converts them
as argparse would, with its own defaults, and prints the table, a row per size, and its footer.
"""
from __future__ import annotations

from topologies.errors import HcclError

from .. import canonical_op
from ..collectives.splits import parse as parse_counts
from ..config.types import dtype_name, parse_reduce_op
from .bench import ROOTED, BenchSpec, footer, format_row, header, parse_size, run_bench, sizes


def _int(flag: str, text, default: int) -> int:
    """An integer option of the nccl format (argparse's message for a bad one)."""
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise HcclError("E_PARA", f"argument {flag}: invalid int value: {text!r}") from None


def run(args, topo, common: dict) -> tuple:
    """The nccl-tests table: (the spec, its rows)."""
    iters, warmup = _int("-n/--iters", args.iters, 5), _int("-w/--warmup_iters", args.warmup_iters, 1)
    check, root = _int("-c/--check", args.check, 1), _int("-r/--root", args.root, 0)
    zero_copy = _int("-z/--zero-copy", args.zero_copy, 0)
    if zero_copy not in (0, 1):
        raise HcclError("E_PARA", f"-z {zero_copy}: expected 0 or 1")
    if zero_copy == 1:
        raise HcclError("E_NOT_SUPPORT", "-z 1: HCCL's zero-copy mode is not modelled in the nccl table (ops are "
                        "priced with their staging through the CCL buffer); see --format hccl_test on atlas900-a3")
    if args.npus_per_node is not None:
        npus = _int("-p/--npus-per-node", args.npus_per_node, 0)
        per = {len(topo.ranks_of_server(s)) for s in set(topo.server_of)}
        if per != {npus}:
            raise HcclError("E_PARA", f"-p {npus}: the topology has {sorted(per)} NPUs per server")
    if iters < 1 or warmup < 0:
        raise HcclError("E_PARA", "-n must be >= 1 and -w >= 0")
    if args.stepbytes is not None and args.stepfactor is not None:
        raise HcclError("E_PARA", "use either -f (multiply) or -i (add bytes), not both")
    step = 0
    if args.stepbytes is not None:
        step = parse_size(args.stepbytes)
        if step < 1:
            raise HcclError("E_PARA", f"-i {args.stepbytes}: the increment must be at least 1 byte")
    factor = _int("-f/--stepfactor", args.stepfactor, 4)          # 0 is refused, never the default
    if check not in (0, 1):
        raise HcclError("E_PARA", f"-c {check}: expected 1 (verify results) or 0")
    spec = BenchSpec(op=args.op, sizes=sizes(parse_size(args.minbytes or "16"), parse_size(args.maxbytes or "64M"),
                                             factor, step),
                     dtype=args.datatype or "float32", redop=(args.redop or "sum").lower(), root=root, iters=iters,
                     warmup=warmup, check=bool(check), counts=None if args.counts is None else parse_counts(args.counts),
                     **common)
    spec.op = canonical_op(spec.op)
    spec.dtype = dtype_name(spec.dtype)
    parse_reduce_op(spec.redop)
    if spec.op in ROOTED and not 0 <= spec.root < topo.num_ranks:
        raise HcclError("E_PARA", f"-r {spec.root}: root must be a rank in [0, {topo.num_ranks})")
    started = []

    def progress(row):
        if not started:          # the header waits for the first row: a refused sweep prints only its error
            started.append(True)
            print(header(spec, topo), flush=True)
        print(format_row(row), flush=True)
    rows = run_bench(spec, topo, progress=progress)
    print(footer(rows))
    return spec, rows
