"""The torch script's fault suite. Plain `pytest` runs each test once, fault-free, and both pass;
`pytest --hccl-chaos 50` runs each under 50 scenarios (crashes, stalls, link faults, slow ranks)
against its fault-free twin: the script that checkpoints its optimiser recovers from every crash
through torchrun's elastic restart, the one that checkpoints only the model fails WRONG once a
crash makes it resume.
"""
from pathlib import Path

import hccl_sim.torch
import pytest

SCRIPT = Path(__file__).with_name("train_ddp.py")
KINDS = ("rank_crash", "rank_stall", "link_flap", "straggler")


def train(tmp_path, *extra):
    results = hccl_sim.torch.launch(SCRIPT, 4, ["--checkpoint-dir", str(tmp_path), *extra], max_restarts=1,
                                    env={"HCCL_EXEC_TIMEOUT": "60"})
    assert all(r["losses"] == results[0]["losses"] for r in results)
    return results


@pytest.mark.hccl_chaos(kinds=KINDS, max_faults=1)
def test_ddp_resumes_from_its_checkpoint(tmp_path):
    train(tmp_path)


@pytest.mark.hccl_chaos(kinds=KINDS, max_faults=1)
def test_ddp_resumes_from_a_model_only_checkpoint(tmp_path):
    train(tmp_path, "--model-only")
