"""The hccl-sim command: nccl-tests table format, busbw factors, JSON, trace, topo, bad arguments."""
import json
import subprocess
import sys

import pytest

from hccl_sim.tools.cli import main

FACTORS = {"allreduce": lambda p: 2 * (p - 1) / p, "allgather": lambda p: (p - 1) / p,
           "reducescatter": lambda p: (p - 1) / p, "alltoall": lambda p: (p - 1) / p,
           "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}


def bench(capsys, *args):
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(out):
    return [line.split() for line in out.splitlines() if line and not line.startswith("#")]


@pytest.mark.local
def test_default_bench_table(capsys):
    code, out, err = bench(capsys, "-e", "1M", "-n", "2")
    assert code == 0 and err == ""
    assert "allreduce on atlas800t-a2 (1 server, 8 ranks, 910B), engine local, data plane central\n" in out
    header = [l for l in out.splitlines() if "count" in l and "type" in l][0].split()
    assert header[1:] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "wall", "algo"]
    rows = rows_of(out)
    assert [int(r[0]) for r in rows] == [16 * 4 ** k for k in range(9)]
    for r in rows:
        assert r[2] == "float" and r[3] == "sum" and r[4] == "-1" and r[8] == "0" and r[10] == "level0:fullmesh"
        assert float(r[5]) > 0 and int(r[1]) == int(r[0]) // 4
    assert "# Out of bounds values : 0 OK" in out
    avg = float(out.split("# Avg bus bandwidth    :")[1].split()[0])
    assert avg == pytest.approx(sum(float(r[7]) for r in rows) / len(rows), rel=1e-3)


@pytest.mark.parametrize("op", list(FACTORS))
@pytest.mark.parametrize("engine", [pytest.param("local", marks=pytest.mark.local),
                                    pytest.param("timing", marks=pytest.mark.unit)])
def test_busbw_factors(capsys, op, engine, tmp_path):
    path = tmp_path / "out.json"
    code, out, _ = bench(capsys, "--op", op, "--topology", "fullmesh", "--ranks", "6", "-b", "96K", "-e", "1M",
                         "-f", "2", "-n", "1", "-w", "0", "--engine", engine, "--json", str(path))
    assert code == 0
    data = json.loads(path.read_text())
    assert data["ranks"] == 6 and data["out_of_bounds"] == {"count": 0, "okay": True}
    for row in data["rows"]:
        assert row["bus_bw"] == pytest.approx(row["alg_bw"] * FACTORS[op](6))
        assert row["alg_bw"] == pytest.approx(row["size"] / row["time"] / 1e3)   # us -> GB/s
        assert row["nwrong"] == (0 if engine == "local" else None)
        assert row["redop"] == ("sum" if op in ("allreduce", "reducescatter", "reduce") else "none")
        assert row["root"] == (0 if op in ("broadcast", "reduce") else -1)
    table = rows_of(out)
    assert len(table) == len(data["rows"]) == 4
    assert data.get("data_plane") == ("central" if engine == "local" else None)
    assert ("data plane" in out.splitlines()[0]) == (engine == "local")      # timing moves no data


@pytest.mark.local
@pytest.mark.parametrize("op", list(FACTORS))
@pytest.mark.parametrize("redop", ["prod", "max"])
def test_check_is_right_for_every_op_and_redop(capsys, op, redop):
    """Expected outputs come from each collective's class (collectives.py): no false #wrong when the
    reduce op does not apply to the collective (its inputs still use the op's verifiable pattern)."""
    code, out, _ = bench(capsys, "--op", op, "--topology", "fullmesh", "--ranks", "5", "-b", "40", "-e", "4K",
                         "-f", "10", "-n", "1", "-w", "0", "-o", redop)
    assert code == 0 and "# Out of bounds values : 0 OK" in out


@pytest.mark.local
def test_bench_rows_size_to_busbw_equal_on_local_and_timing_engines(capsys):
    args = ["--op", "allgather", "--topology", "atlas800t-a2", "--servers", "2", "-b", "1K", "-e", "256K", "-n", "1"]
    _, local, _ = bench(capsys, *args)
    _, timing, _ = bench(capsys, *args, "--engine", "timing")
    assert [r[:8] for r in rows_of(local)] == [r[:8] for r in rows_of(timing)]


@pytest.mark.local
def test_options_and_trace(capsys, tmp_path):
    trace = tmp_path / "t.json"
    code, out, _ = bench(capsys, "--op", "broadcast", "-r", "3", "-d", "int8", "--algo", "ring", "--topology", "ring", "--ranks", "6", "-b", "1K",
                         "-e", "4K", "-i", "1K", "--trace", str(trace), "--env", "HCCL_BUFFSIZE=1")
    assert code == 0
    rows = rows_of(out)
    assert [int(r[0]) for r in rows] == [1024, 2048, 3072, 4096]
    assert all(r[2] == "int8" and r[4] == "3" and r[10] == "ring" for r in rows)
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X"} and any(e["name"].startswith("send->") for e in events)


@pytest.mark.unit
@pytest.mark.parametrize("args,message", [
    (["bench", "--op", "allscatter"], "unknown collective"),
    (["bench", "-b", "1X"], "is not a byte count"),
    (["bench", "-b", "1M", "-e", "1K"], "is empty"),
    (["bench", "-d", "complex"], "unsupported data type"),
    (["bench", "-o", "avg"], "unsupported reduce op"),
    (["bench", "--topology", "fullmesh"], "needs --ranks"),
    (["bench", "--topology", "nope.json"], "cannot read"),
    (["bench", "--op", "reduce", "-r", "8"], "root must be a rank"),
    (["bench", "--env", "HCCL_ALGO=level1:Ring"], "HCCL_ALGO"),
    (["bench", "--engine", "quantum"], "bench runs on local, ray, mpi or timing"),
    (["bench", "--format", "csv"], "expected nccl or hccl_test"),
    (["bench", "-z", "1"], "zero-copy mode is not modelled"),
    (["bench", "--ranks-per-process", "2"], "settings of --engine mpi"),
    (["bench", "-p", "4"], "-p 4: the topology has [8] NPUs per server"),
    (["bench", "-n", "x"], "invalid int value"),
    (["bench", "--servers", "0"], "servers must be an integer in [1, 131072]"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_one_line(capsys, args, message):
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("hccl-sim: error:") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.unit
def test_topo_command(capsys, tmp_path):
    path = tmp_path / "rt.json"
    assert main(["topo", "atlas800t-a2", "--servers", "2", "--ranktable", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ranks      : 16" in out and "HCCS" in out and "RoCE" in out
    assert "route 0 -> 8: 0 -> roce -> 8 over RoCE, latency 7 us, bottleneck 20.73 GB/s" in out
    assert main(["topo", str(path), "--route", "3", "4"]) == 0
    assert "route 3 -> 4: 3 -> 4 over HCCS" in capsys.readouterr().out


@pytest.mark.unit
def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "hccl_sim", "bench", "--engine", "timing", "-e", "64"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "# Out of bounds values : 0 OK" in proc.stdout


@pytest.mark.unit
def test_bench_under_a_fault_plan(capsys, tmp_path):
    """--faults adds each row's retries and the simulated time lost against the fault-free twin;
    a bad plan is one line and exit status 2."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("seed: 3\nfaults:\n  - {kind: link_flap, a: 0, b: 8, at: 0.0, duration: 0.0005}\n")
    env = ["--env", "HCCL_RDMA_TIMEOUT=5", "--env", "HCCL_RDMA_RETRY_CNT=1", "--env", "HCCL_OP_RETRY_ENABLE=L1:1",
           "--env", "HCCL_OP_RETRY_PARAMS=MaxCnt:1,HoldTime:2"]
    out_json = tmp_path / "rows.json"
    trace = tmp_path / "trace.json"
    assert main(["bench", "--servers", "2", "--engine", "timing", "-b", "1M", "-e", "4M", "--faults", str(plan),
                 "--json", str(out_json), "--trace", str(trace)] + env) == 0
    out = capsys.readouterr().out
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "op retry 1: wait" for e in events)
    assert "retries      lost" in out and "under fault plan (seed 3, 1 fault(s))" in out
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["retries"] for r in rows] == [1, 1]
    # each op's first RoCE transfer (at t0 < 100 us) fails twice, 131 us apart; HoldTime 2 ms later
    # the op runs again: t0 + 2 x 131 + 2000 us lost
    assert all(2262 < r["lost_time"] < 2362 for r in rows)
    assert main(["bench", "--servers", "2", "--engine", "timing", "-b", "1M", "-e", "1M"] + env) == 0
    assert "retries" not in capsys.readouterr().out
    plan.write_text("faults:\n  - {kind: link_flap, a: 0, b: 99, at: 0, duration: 1}\n")
    assert main(["bench", "--servers", "2", "--faults", str(plan)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b=99 is not a rank of atlas800t-a2" in err
