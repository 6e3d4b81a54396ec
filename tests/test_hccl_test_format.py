"""`hccl-sim bench --format hccl_test` against hccl_test's source (hicann/oam-tools ea0ce91,
src/hccl_test/; docs/references.md §11.5): defaults, argument checks and their messages, the
header and rows, the check rule, the NULL limits, data types and -z."""
import re

import numpy as np
import pytest

from hccl_sim.tools import hccl_test as ht
from hccl_sim.tools import hccl_test_data as htd
from hccl_sim.tools.cli import main

pytestmark = pytest.mark.local     # a few tests run real data on the local engine
TIMING = ["--format", "hccl_test", "--engine", "timing"]
ROW = re.compile(r"^(\d+) {0,16} \| ([0-9.]+) {0,13} \| ([0-9.]+) {0,19} \| (success|failed|NULL)$")


def run(capsys, *args):
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_defaults(capsys):
    # hccl_test_common.h: data_parsed_begin/end 64 MiB, iters 20, warmup_iters 10; step_bytes 1 when -b = -e
    # (hccl_test_common.cc check_data_count), so one size
    code, lines, err = run(capsys, *TIMING)
    assert code == 0 and err == ""
    assert lines[0] == "the minbytes is 67108864, maxbytes is 67108864, iters is 20, warmup_iters is 10"
    assert len(lines) == 3 and lines[2].startswith("67108864          | ") and lines[2].endswith("| NULL")
    o = ht.Options()
    assert (o.redop, o.dtype, o.root, o.check, o.zero_copy) == ("sum", "fp32", 0, 1, 0)


def test_default_step_is_a_tenth_and_f_wins_over_i(capsys):
    # hccl_test_common.cc check_data_count: step (e - b) / 10; -f with -i: a warning, -f used
    o = ht.Options(minbytes=100, maxbytes=1000)
    assert ht.data_sizes(o, "allreduce", 8)[2] == list(range(100, 1001, 90))
    code, lines, _ = run(capsys, *TIMING, "-b", "1K", "-e", "4K", "-i", "100", "-f", "2")
    assert lines[0] == "Warning: [-f,--stepfactor] and [-i,--stepbytes] are set, [-f,--stepfactor] is enabled by default."
    assert [int(line.split()[0]) for line in lines[3:]] == [1024, 2048, 4096]


def test_float_factor_truncates_and_strtol_reads_octal(capsys):
    # opbase_test_by_data_size: data_size *= step_factor (u64 x double); strtol_alldigit: base 0
    code, lines, _ = run(capsys, *TIMING, "-b", "1000", "-e", "3000", "-f", "1.5", "-n", "010", "-w", "0")
    assert lines[0] == "the minbytes is 1000, maxbytes is 3000, iters is 8, warmup_iters is 0"
    assert [int(line.split()[0]) for line in lines[2:]] == [1000, 1500, 2250]


def test_block_binaries_align_sizes_to_the_rank_count(capsys):
    # hccl_test_common.cc check_data_count (need_ranksize_alignment): at least p, a multiple of p,
    # above 16 MiB a multiple of p x 512; the step rounded up to a multiple of p
    o = ht.Options(minbytes=5, maxbytes=100, stepbytes=30)
    assert ht.data_sizes(o, "allgather", 8) == (8, 96, [8, 40, 72])
    assert ht.align(16 * 2 ** 20 + 8192, 8) == 16 * 2 ** 20 + 8192 - 8192 % 4096
    # alltoall_test: count rounded up to p x 128 elements from p x 128 on (init_malloc_Ksize_by_data)
    assert ht.op_bytes("alltoall", 8 * 130 * 4, 8, 4, False) == 8 * 128 * 2 * 4
    assert ht.op_bytes("alltoallv", 40, 8, 4, False) == 64
    assert ht.op_bytes("allgather", 36, 8, 4, False) == 64        # ceil(9 / 8) = 2 elements per rank


@pytest.mark.parametrize("args, message", [        # hccl_test_common.cc: parse_opt, check_data_count, check_cmd_line
    (["-b", "0"], "invalid size specified for [-b,--minbytes] or [-e,--maxbytes]"),
    (["-e", "64MB"], "invalid size specified for [-b,--minbytes] or [-e,--maxbytes]"),
    (["-b", "2K", "-e", "1K"], "invalid option: maxbytes < minbytes, Check the [-b,--minbytes] and [-e,--maxbytes] options."),
    (["-i", "1K"], "Error:In judge all digit, Check whether the value of [-i -n -r -w -c -p] is a positive integer."),
    (["-n", "-1"], "Error:In judge all digit, Check whether the value of [-i -n -r -w -c -p] is a positive integer."),
    (["-f", "1"], "Error: [-f,--stepfactor] Must be greater than 1.0f, Start step mod."),
    (["-d", "float32"], "Error: [-d,--datatype] is invalid, Use [-h,--help] to check the correct input parameter."),
    (["-o", "SUM"], "Error: [-o,--op] is invalid, Use [-h,--help] to check the correct input parameter."),
    (["-r", "8"], "Error: [-r,--root <root>] is invalid, root rank must be greater than or equal to 0 and less than "
                  "or equal to 7."),
    (["-c", "3"], "Error: [-c,--check] is invalid, check should be 0 or 1 or 2"),
    (["-p", "9"], "Error: [-p,--npus <npus used for one node>] is invalid, npus must be greater than or equal to 1 "
                  "and less than or equal to 8."),
    (["-z", "x"], "terminate called after throwing an instance of 'std::invalid_argument' what():  stoi"),
    (["-d", "int8", "-o", "avg"], "Error: [-o,--op] is invalid"),      # check_cmd_line's order: -d, then -o
])
def test_argument_checks_print_hccl_tests_message_on_one_line(capsys, args, message):
    code, lines, err = run(capsys, *TIMING, *args)
    assert code == 2 and lines == [] and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("args, words", [          # hccl-sim's own refusals, on top of the source's rules
    (["-n", "0"], "divides its elapsed time by 0"),
    (["-c", "2"], "is not emulated"),
    (["-i", "0", "-e", "128M"], "would repeat 67108864 B forever"),
    (["-p", "4"], "the topology has [8] NPUs per server"),
    (["--op", "alltoallv", "--counts", "zipf:1"], "drop --counts"),
])
def test_hccl_sim_refusals(capsys, args, words):
    code, lines, err = run(capsys, *TIMING, *args)
    assert code == 2 and lines == [] and words in err and err.count("\n") == 1, err


def test_header_and_row_format():
    # hccl_opbase_rootinfo_base.cc print_execution_time: "%-15s | %-12s | %-18s | %s" and
    # "%-17llu | %-14.2f | %-20.5f | ..." (the header names are longer than their widths)
    assert ht.HEADER == "data_size(Bytes): | aveg_time(us): | alg_bandwidth(GB/s): | check_result:"
    assert ht.row_text(8192, 764.551, 0.0099812, "success") == \
        "8192              | 764.55         | 0.00998              | success"
    assert ROW.match(ht.row_text(67108864, 2630.2, 23.76245, "NULL"))
    # aclrtEventElapsedTime's float ms x 1000 in float, over iters in double
    assert ht.average_us(20 * 764_551, 20) == pytest.approx(764.551, rel=1e-6)
    assert ht.average_us(3, 1) == float(np.float32(np.float32(3e-6) * np.float32(1000)))


def test_rows_print_the_root_ranks_time_and_bandwidth(capsys):
    # the root rank (-r) prints; alg_bandwidth = malloc_kSize (x p for AllGather) / avg_time
    code, lines, _ = run(capsys, *TIMING, "--op", "allgather", "--topology", "atlas800t-a2", "--servers", "2",
                         "-b", "64K", "-e", "64K", "-n", "1", "-r", "9", "--json", "/dev/null")
    size, avg, bw, result = ROW.match(lines[2]).groups()
    assert result == "NULL" and float(bw) == pytest.approx(65536 / float(avg) / 1e3, rel=1e-3)


def test_check_rule_on_real_data(capsys):
    # hccl_check_buf_init.cc: every input 2 (sum 2p, prod 2^p, max 2); hccl_alltoall_rootinfo_test.cc's
    # byte pattern; AlltoAllV's block from rank i is i + 1
    for op, redop in (("allreduce", "prod"), ("reducescatter", "sum"), ("alltoall", "sum"), ("alltoallv", "max"),
                      ("scatter", "sum"), ("reduce", "min")):
        code, lines, _ = run(capsys, "--format", "hccl_test", "--op", op, "--topology", "fullmesh", "--ranks", "3",
                             "-b", "96", "-e", "96", "-n", "1", "-w", "0", "-d", "int32", "-r", "2")
        assert code == 0 and lines[-1].endswith("| success"), (op, lines)
    assert list(htd.inputs("allreduce", 1, 4, 2, "float32", "sum", 0)) == [2, 2]
    assert list(htd.reduce_check("float32", 2, "prod", 5, 1)) == [32.0]
    assert list(htd.expected("reducescatter", 2, 4, 1, "int32", "sum", 0)) == [12]      # block i = i + 1, sum
    assert list(htd.expected("alltoallv", 0, 3, 3, "int16", "sum", 0)) == [1, 2, 3]
    assert htd.inputs("alltoall", 0, 2, 2, "float32", "sum", 0).view(np.uint8).tolist() == [0x5a] * 4 + [0xa5] * 4


def test_bf16_prod_is_refused_and_a_type_without_a_check_fails(capsys):
    # fp32tobf16 returns its float converted to uint16: hccl_test's bf16 2 is the subnormal 0x0002;
    # its product would underflow, but HCCL multiplies no bf16 on any device (CheckReduceOp,
    # CheckReduceDataType): the call fails before any check
    assert htd.bf16_bits(2.0) == 2 and htd.bf16_bits(2.0 ** 16) == 0
    code, _, err = run(capsys, "--format", "hccl_test", "-d", "bfp16", "-o", "prod", "--topology", "fullmesh",
                       "--ranks", "2", "-b", "8", "-e", "16", "-f", "2", "-n", "1", "-w", "0")
    assert code == 2 and "reduceop is [prod] data type[bfloat16] not supported" in err
    # reduce_scatterv_test's check switch has no uint64 case: "no match datatype", a failure on every rank
    code, lines, _ = run(capsys, "--format", "hccl_test", "--op", "reducescatterv", "-d", "uint64", "--topology",
                         "fullmesh", "--ranks", "2", "-b", "16", "-e", "32", "-f", "2", "-n", "1", "-w", "0")
    assert code == 1 and lines.count("no match datatype") == 4 and lines[-1].endswith("| failed")
    assert lines[3].startswith("local rank_id 0, check result failed, 16 ")
    assert sum(line.startswith("local rank_id") for line in lines) == 4         # 2 ranks x 2 sizes
    assert lines.count(ht.HEADER) == 1


@pytest.mark.parametrize("op, dtype, redop, most", [   # docs/zh/hccl_test/execution.md's table = the source's limits
    ("allreduce", "int8", "prod", 6), ("reduce", "int32", "prod", 30), ("allreduce", "float16", "prod", 15),
    ("allreduce", "float32", "prod", 127), ("reducescatter", "int64", "prod", 62),
    ("allreduce", "int8", "sum", 63), ("reduce", "int16", "sum", 16383), ("allreduce", "float16", "sum", 511),
    ("allreduce", "bfloat16", "sum", 63), ("reducescatter", "int8", "sum", 11), ("reducescatter", "int16", "sum", 181),
    ("reducescatter", "int32", "sum", 46340), ("reducescatter", "float32", "sum", 2896),
    ("reducescatterv", "float16", "sum", 31), ("reducescatterv", "bfloat16", "sum", 11),
    ("allgather", "uint8", "sum", 127), ("alltoallvc", "float8_e5m2", "sum", 127),
])
def test_null_limits(op, dtype, redop, most):
    # hccl_opbase_rootinfo_base.{h,cc} is_data_overflow / is_initdata_overflow and each op's override
    assert htd.unchecked(op, dtype, redop, most) is None
    assert htd.unchecked(op, dtype, redop, most + 1) in (htd.OVERFLOW, htd.INITDATA_OVERFLOW)
    if op in htd.REDUCING:                  # max and min never overflow; Broadcast checks no overflow at all
        assert htd.unchecked(op, dtype, "max", 10 ** 6) is None
    assert htd.unchecked("broadcast", "int8", "sum", 999) is None


def test_overflow_prints_its_warning_and_null(capsys):
    # no_verification: the warning once (before the header), then NULL rows, whatever -c says
    code, lines, _ = run(capsys, *TIMING, "-d", "int8", "-o", "prod", "--topology", "fullmesh", "--ranks", "7",
                         "-b", "1K", "-e", "2K", "-f", "2", "-c", "0")
    assert lines[1] == "Warning: The calculation result overflows, No verification is performed."
    assert lines[2] == ht.HEADER and all(line.endswith("| NULL") for line in lines[3:])


def test_data_types_run_where_hccl_takes_them(capsys):
    # test_typenames (hccl_test_common.cc): 17 names; hif8 is one of its byte types
    for name in ("int8", "uint16", "fp64", "bfp16", "hif8", "fp8e4m3", "fp8e5m2", "fp8e8m0"):
        code, lines, _ = run(capsys, "--format", "hccl_test", "--op", "allgather", "-d", name, "--topology", "fullmesh",
                             "--ranks", "2", "-b", "16", "-e", "16", "-n", "1", "-w", "0")
        assert code == 0 and lines[-1].endswith("| success"), (name, lines)
    code, lines, err = run(capsys, *TIMING, "-d", "int128")        # hccl_test sizes it as 4 bytes, writes nothing
    assert code == 2 and "hccl_test has no int128 case" in err and err.count("\n") == 1
    code, _, err = run(capsys, *TIMING, "-d", "fp8e4m3")           # no device reduces fp8 (op_common.cc, §9.3)
    assert code == 2 and "data type[fp8e4m3] not supported, support range=" in err
    code, _, err = run(capsys, "--format", "hccl_test", "--op", "allgather", "-d", "hif8", "--topology",
                       "atlas800t-a2", "-b", "16", "-e", "16", "-n", "1", "-w", "0", "-c", "0")
    assert code == 2 and "data type[hif8] not supported (hcomm's legacy path on 910B" in err    # HcomCheckDataType


def test_zero_copy_on_a3_drops_staging_and_is_refused_elsewhere(capsys):
    # cmdline_options_desc.md -z: A3 only; all_reduce, reduce_scatter, all_gather, broadcast
    args = [*TIMING, "--topology", "atlas900-a3", "-b", "4M", "-e", "4M", "-n", "1"]
    _, staged, _ = run(capsys, *args)
    code, zero, _ = run(capsys, *args, "-z", "1")
    assert code == 0 and float(zero[2].split("|")[1]) < float(staged[2].split("|")[1])
    code, _, err = run(capsys, *TIMING, "-z", "1")
    assert code == 2 and "Atlas A3" in err and "910B" in err
    code, _, err = run(capsys, *TIMING, "--topology", "atlas900-a3", "-z", "1", "--op", "reduce")
    assert code == 2 and "zero-copy covers" in err
    assert ht.op_bytes("alltoall", 64, 16, 4, True) == 16 * 128 * 4          # alltoall_test aligns to p x 128
