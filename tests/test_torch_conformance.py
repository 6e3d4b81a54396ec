"""A fast subset of torch's own distributed suite (distributed_test, as torch runs a third-party
backend: 4 spawned processes, file:// init) against the hccl_sim backend, through
experiments/torch_conformance.py: cases the backend failed before it had them (any-source
receives, gather). The full table, with gloo in the same run, is that script's
(README, "torch.distributed")."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "torch_conformance.py"
CASES = ("test_send_recv_any_source", "test_gather")


def test_torchs_own_cases_pass_on_the_backend(tmp_path):
    out = tmp_path / "conformance.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--backend", "hccl_sim", "-k", "|".join(f"{c}$" for c in CASES),
                           "--out", str(tmp_path / "conformance.md"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())["runs"]["hccl_sim"]["results"]
    assert {case: r["outcome"] for case, r in results.items()} == {case: "passed" for case in CASES}, results
