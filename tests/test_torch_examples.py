"""The torch parallelism examples (examples/torch_*.py) on 4 Ray ranks: each one's losses and
final parameters against the same model trained in one process on the whole batch."""
import importlib
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

EXAMPLES = str(Path(__file__).resolve().parents[1] / "examples")


def _example(name):
    """The example and its shared module, which the rank actors unpickle by value."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    module = importlib.import_module(name)
    lm = importlib.import_module("tiny_lm")
    lm.on_ray(module)
    return module, lm


def _check(res, lm, steps, batch, want_ops):
    losses, want = lm.reference(steps, batch)
    for log, params in res:
        assert max(abs(a - b) for a, b in zip((loss for loss, *_ in log), losses)) < 1e-5
        assert all(float((params[k] - want[k]).abs().max()) < 1e-5 for k in want)
        assert {(dim, name) for _, ops, *_ in log for dim, name, *_ in ops} == want_ops
        _check_steps(log)


def _check_steps(log):
    """Each step's simulated breakdown: kernels with FLOPs, communication no longer than the step,
    and the steps after the first (the same work) priced alike."""
    for _, ops, _, step, *_ in log:
        comm = sum(t for *_, t in ops) * 1e9
        assert step.kernels > 0 and step.flops > 0 and step.compute > 0
        assert step.time == step.compute + step.exposed and 0 <= step.exposed <= step.time
        assert step.time >= step.compute and step.exposed <= comm + 1      # exposed: part of the communication
    later = {(s.time, s.compute, s.kernels) for *_, s in (entry[:4] for entry in log[1:])}
    assert len(later) == 1, later


def test_fsdp2_transformer_equals_one_process_on_the_whole_batch(torch_cluster):
    ex, lm = _example("torch_fsdp2")
    res = torch_cluster.run(lm.on_ray_rank, args=(ex.train, 3, 16))
    _check(res, lm, 3, 16, {("dp", "all_gather"), ("dp", "reduce_scatter"), ("dp", "all_reduce")})


def test_tensor_parallel_by_fsdp2_on_a_2d_mesh_equals_one_process_and_its_step_replays(torch_cluster, tmp_path):
    ex, lm = _example("torch_tp")
    ex.TP, ex.TRACE = 2, str(tmp_path / "step.json")          # dp 2 x tp 2; rank 0's last step
    res = torch_cluster.run(lm.on_ray_rank, args=(ex.train, 3, 16))
    # TP's activations and their gradients are AllReduces inside tp; FSDP2's are in dp; the loss's mean over all
    _check(res, lm, 3, 16, {("tp", "all_reduce"), ("dp", "all_gather"), ("dp", "reduce_scatter"),
                            ("world", "all_reduce")})
    import hccl_sim
    from hccl_sim.tools import trace_replay as replay
    trace = replay.load(ex.TRACE)
    last_step = res[0][0][-1][1]                               # rank 0's (dim, op, algo, time) of its last step
    assert sorted((op["dim"], op["op"]) for op in trace["ops"]) == \
        sorted((dim, hccl_sim.canonical_op(name)) for dim, name, *_ in last_step)
    got = replay.replay(trace, hccl_sim.topology("atlas800t-a2", servers=4), replay.parse_mesh("dp=4,tp=8"))
    assert set(got["per_dim"]) == {"tp", "dp", "world"} and got["group_sizes"]["dp"] == 4


def test_expert_parallel_moe_dispatch_and_combine_equal_one_process(torch_cluster):
    ex, lm = _example("torch_moe")
    res = torch_cluster.run(lm.on_ray_rank, args=(ex.train, 3, 64))
    losses, want = ex.reference(3, 64, 4)
    for log, params in res:
        assert max(abs(a - b) for a, b in zip((entry[0] for entry in log), losses)) < 1e-5
        assert all(float((params[k] - want[k]).abs().max()) < 1e-5 for k in want)
        names = [name for _, ops, *_ in log for _, name, *_ in ops]
        assert names.count("all_to_all_v") == 3 * 3 and names.count("all_to_all") == 3     # uneven: AlltoAllV
        assert all(entry[4] > 64 // 4 for entry in log)                                     # skewed loads
        for _, ops, _, step, _ in log:
            assert step.kernels > 0 and 0 < step.exposed <= step.time


def test_gpipe_pipeline_of_a_stage_per_rank_equals_one_process(torch_cluster):
    ex, lm = _example("torch_pp")
    res = torch_cluster.run(lm.on_ray_rank, args=(ex.train, 3, 16))
    losses, want = lm.reference(3, 16, layers=4)
    for r, (log, params) in enumerate(res):
        assert max(abs(a - b) for a, b in zip((loss for loss, *_ in log), losses)) < 1e-5
        assert all(float((params[k] - want[k]).abs().max()) < 1e-5 for k in want)
        kinds = {name for _, ops, *_ in log for _, name, *_ in ops}
        # activations forward and gradients back are sends and receives; the loss's sum an AllReduce
        assert kinds == {"isend", "irecv", "all_reduce"}
        for _, ops, _, step in log[1:]:     # every stage but the first waits for its input: the bubble
            assert step.kernels > 0 and (step.exposed > 0 if r else step.exposed >= 0)
