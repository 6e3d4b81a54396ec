"""A torch script as the subject (hccl_sim.torch.launch): run unchanged under torchrun (a process per
rank) and on Ray, each rank's hccl_sim.torch.report its result; a fault plan's crash is a clean
error or, with torchrun's elastic restart and a checkpoint, a recovery bit for bit; a fault suite
(hccl_sim.testing, `hccl-sim chaos --script`) runs it under scenarios against its twin and finds a
checkpoint that forgets the optimiser."""
from pathlib import Path

import pytest

import hccl_sim
from hccl_sim.tools.cli import main as cli_main

pytestmark = pytest.mark.torch

import hccl_sim.torch as ht  # noqa: E402
from hccl_sim.testing import explore, replay, token  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "torch_fault_suite" / "train_ddp.py"
ENV = {"HCCL_EXEC_TIMEOUT": "60"}
"""Two ranks: a float sum of two is the same in either order, so a resumed job is bit for bit the
fault-free one (with more, see examples/torch_fault_suite's check)."""


def _same(a, b):
    """Two launches' results, losses and parameters, bit for bit."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["losses"] == y["losses"]
        assert x["params"].keys() == y["params"].keys()
        for k in x["params"]:
            assert x["params"][k].equal(y["params"][k]), k


def test_a_script_reports_the_same_under_torchrun_and_on_ray(torch_cluster, tmp_path):
    """The example DDP script, unchanged, on 4 ranks: every rank reports the mean losses; torchrun's
    processes and Ray's actors give the same numbers bit for bit."""
    on_torchrun = ht.launch(SCRIPT, 4, ["--steps", "3"], env=ENV)
    on_ray = ht.launch(SCRIPT, 4, ["--steps", "3"], engine="ray", cluster=torch_cluster, env=ENV)
    assert len(on_torchrun) == 4 and len(on_torchrun[0]["losses"]) == 3
    assert all(r["losses"] == on_torchrun[0]["losses"] for r in on_torchrun)
    _same(on_torchrun, on_ray)


def test_a_crash_is_a_clean_error_and_an_elastic_restart_from_a_checkpoint_recovers(tmp_path):
    """A rank crashed in step 1's gradient AllReduce: without restarts the job ends in the lost
    rank's E_TIMEOUT naming the plan's entry; with torchrun's --max-restarts 1 and a checkpoint per
    step the job resumes and ends with the fault-free run's losses and parameters."""
    args = ["--steps", "3", "--checkpoint-dir", str(tmp_path)]
    twin = ht.launch(SCRIPT, 2, args, env=ENV)
    plan = hccl_sim.FaultPlan()
    plan.rank_crash(1, at_op=6)
    with pytest.raises(hccl_sim.HcclError) as info:
        ht.launch(SCRIPT, 2, args, env=ENV, faults=plan)
    err = info.value
    assert err.code == "E_TIMEOUT" and err.cause == "RANK_LOST" and err.peers == (1,)
    assert err.fault == "fault plan entry 0 (rank_crash rank 1)"
    _same(ht.launch(SCRIPT, 2, args, env=ENV, faults=plan, max_restarts=1), twin)


def test_an_fsdp2_script_restarted_after_a_crash_ends_as_the_fault_free_one():
    """examples/torch_fsdp2.py (FSDP2 of a small decoder, its losses and full parameters reported by
    tiny_lm.launch) under torchrun: a rank crashed in the second step's collectives, and the job
    torchrun restarts from scratch gives the fault-free job's numbers bit for bit."""
    fsdp2 = SCRIPT.parent.parent / "torch_fsdp2.py"
    args = ["--steps", "2", "--batch", "8"]
    twin = ht.launch(fsdp2, 2, args, env=ENV)
    plan = hccl_sim.FaultPlan()
    plan.rank_crash(0, at_op=30)
    with pytest.raises(hccl_sim.HcclError) as info:          # the crash is met: without a restart, the job ends
        ht.launch(fsdp2, 2, args, env=ENV, faults=plan)
    assert info.value.fault == "fault plan entry 0 (rank_crash rank 0)"
    again = ht.launch(fsdp2, 2, args, env=ENV, faults=plan, max_restarts=1)
    assert len(twin[0]["losses"]) == 2
    _same(again, twin)


def test_a_fault_suite_of_a_script_finds_a_checkpoint_without_the_optimiser(tmp_path):
    """explore() over a launch: scenarios aimed at the script's calls recover (restart from the
    checkpoint) or end cleanly; a crash after the first checkpoint replayed on the script that
    checkpoints only its model is WRONG: its resumed last step has lost the momentum, and its
    parameters differ from the twin's (the whole checkpoint recovers from such a crash bit for bit:
    test_a_crash_is_a_clean_error_and_an_elastic_restart_from_a_checkpoint_recovers)."""
    def body(*extra):
        return lambda: ht.launch(SCRIPT, 2, ["--steps", "3", "--checkpoint-dir", str(tmp_path), *extra],
                                 env=ENV, max_restarts=1)
    report = explore(body(), "ddp", n=2, seed=5, kinds=("rank_crash", "rank_stall"), max_faults=1)
    assert not report.failed, report.to_dict()
    assert len(report.scenarios) == 2
    plan = hccl_sim.FaultPlan()
    plan.rank_crash(0, at_op=12)              # in step 2, after step 1's checkpoint
    wrong = replay(body("--model-only"), token.encode("ddp-model-only", plan), "ddp-model-only")
    assert wrong.outcome == "WRONG" and "result['params']" in wrong.verdict.detail, wrong.verdict.detail


def test_a_rank_stalled_in_ddps_backward_is_the_plans_stall(torch_cluster):
    """A stall met by a gradient bucket's AllReduce, which DDP's reducer waits for in C++ (torch
    raises a RuntimeError of its own words there; torch's futures take no BaseException): the
    stalled rank's end is the plan's stall (its result None), its peers' the E_TIMEOUT naming it: a
    clean error, not a foreign RuntimeError nor a rank waiting for ever. Under torchrun (step 0's
    and step 1's bucket) and on Ray."""
    def on_torchrun():
        return ht.launch(SCRIPT, 2, ["--steps", "2"], env=ENV)

    def on_ray():
        return ht.launch(SCRIPT, 4, ["--steps", "2"], engine="ray", cluster=torch_cluster, env=ENV)
    for body, entry in ((on_torchrun, {"at_op": 1}), (on_torchrun, {"at_op": 3}), (on_ray, {"at_op": 3})):
        plan = hccl_sim.FaultPlan()
        plan.rank_stall(1, **entry)
        scenario = replay(body, token.encode("stall", plan), "stall", deadline_s=60)
        assert scenario.outcome == "clean error", (entry, scenario.verdict.detail)


def test_chaos_script_command(tmp_path, capsys):
    """`hccl-sim chaos --script`: the twin and one scenario, a summary line, exit status 0."""
    code = cli_main(["chaos", "--script", str(SCRIPT), "--nproc", "2", "-n", "1", "--seed", "1",
                     "--kinds", "straggler,link_flap", "--args", "--steps 2", "--env", "HCCL_EXEC_TIMEOUT=60",
                     "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "hccl-chaos train_ddp.py --nproc 2: 1 scenarios:" in out and "0 WRONG" in out
    assert '"scenarios"' in (tmp_path / "r.json").read_text()


def test_chaos_script_replay_line_keeps_what_shapes_a_run():
    """The replay command a failing suite prints carries every option that changes a run or its
    verdict (restarts, environment, check, allowed codes, the script's arguments), not only the token."""
    from hccl_sim.tools.cli import build_parser
    from hccl_sim.tools.script_chaos import replay_command
    args = build_parser().parse_args(["chaos", "--script", "t.py", "--nproc", "4", "--max-restarts", "1",
                                      "--env", "HCCL_EXEC_TIMEOUT=60", "--check", "c.py:f", "--allow", "E_TIMEOUT",
                                      "--args", "--steps 2"])
    cmd = " ".join(replay_command(args, "torchrun"))
    for part in ("--script t.py", "--nproc 4", "--engine torchrun", "--max-restarts 1", "--env HCCL_EXEC_TIMEOUT=60",
                 "--check c.py:f", "--allow E_TIMEOUT", "--args --steps 2"):
        assert part in cmd, (part, cmd)


@pytest.mark.parametrize("argv, says", [
    (["--script", "no_such.py", "--nproc", "2"], "no such file"),
    (["--script", str(SCRIPT), "--nproc", "1"], "at least 2 ranks"),
    (["--script", str(SCRIPT), "--nproc", "2", "--engine", "mpi"], "torchrun or on ray"),
    (["--script", str(SCRIPT), "--nproc", "3", "--topology", "atlas800t-a2", "--servers", "1"], "has 8 ranks"),
    (["--script", str(SCRIPT), "--nproc", "2", "--check", "nofile.py:f"], "no such file nofile.py"),
    (["--max-restarts", "1"], "--max-restarts is an option of a script's fault suite"),
])
def test_chaos_script_bad_arguments(argv, says, capsys):
    assert cli_main(["chaos", *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("kwargs, says", [
    ({"script": "no_such.py", "nproc": 2}, "no script at"),
    ({"script": SCRIPT, "nproc": 0}, "nproc must be a positive integer"),
    ({"script": SCRIPT, "nproc": 2, "engine": "mpi"}, "is not one of torchrun, ray"),
    ({"script": SCRIPT, "nproc": 2, "max_restarts": -1}, "max_restarts must be"),
    ({"script": SCRIPT, "nproc": 2, "engine": "ray", "max_restarts": 1}, "torchrun's elastic restart"),
    ({"script": SCRIPT, "nproc": 3, "topology": "atlas800t-a2"}, "has 8 ranks but nproc is 3"),
])
def test_launch_bad_arguments(kwargs, says):
    with pytest.raises(hccl_sim.HcclError) as info:
        ht.launch(**kwargs)
    assert says in str(info.value)
