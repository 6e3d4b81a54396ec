"""The torch script's fault suite. Plain `pytest` runs each test once, fault-free, and both pass;
`pytest --hccl-chaos 50` runs each under 50 scenarios (crashes, stalls, link faults, slow ranks)
against its fault-free twin: the script that checkpoints its optimiser recovers from every crash
through torchrun's elastic restart, the one that checkpoints only the model fails WRONG once a
crash makes it resume. Each scenario is a whole torchrun job (about 10-25 s on 2 cores).
"""
from pathlib import Path

import hccl_sim.torch
import pytest
import torch

SCRIPT = Path(__file__).with_name("train_ddp.py")
KINDS = ("rank_crash", "rank_stall", "link_flap", "straggler")
ENV = {"HCCL_EXEC_TIMEOUT": "60"}


def close_to_the_twin(results, twin):
    """A resumed job's numbers equal the fault-free job's within float rounding, not bit for bit: the
    restart's first step runs DDP's first-iteration gradient buckets, not the rebuilt ones the
    twin had by then, and an AllReduce of another size may sum the four ranks' floats in another
    order (so would HCCL's). A lost momentum is far outside this."""
    for r, t in zip(results, twin):
        assert len(r["losses"]) == len(t["losses"])
        for a, b in zip(r["losses"], t["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), f"loss {a} against the twin's {b}"
        for name, want in t["params"].items():
            assert torch.allclose(r["params"][name], want, rtol=1e-4, atol=1e-6), name


def train(tmp_path, *extra):
    results = hccl_sim.torch.launch(SCRIPT, 4, ["--checkpoint-dir", str(tmp_path), *extra], max_restarts=1,
                                    env=ENV)
    assert all(r["losses"] == results[0]["losses"] for r in results)
    return results


@pytest.mark.hccl_chaos(kinds=KINDS, max_faults=1, check=close_to_the_twin)
def test_ddp_resumes_from_its_checkpoint(tmp_path):
    train(tmp_path)


@pytest.mark.hccl_chaos(kinds=KINDS, max_faults=1, check=close_to_the_twin)
def test_ddp_resumes_from_a_model_only_checkpoint(tmp_path):
    train(tmp_path, "--model-only")
