"""Smoke test of an experiment script at a tiny size: experiments/busbw_vs_servers.py on 1-2 servers."""
import importlib.util
from pathlib import Path

import pytest

import hccl_sim

pytestmark = pytest.mark.unit

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_busbw_vs_servers_names_fallbacks_and_writes_table_and_plot(tmp_path):
    bb = _load("busbw_vs_servers")
    out = tmp_path / "bb"
    results = bb.main(["--max-servers", "2", "--bytes", "1M", "--out", str(out)])
    md = out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "| ring | H-D_R | NHR | NB | pipeline |" in md and "Regenerate: `python experiments/busbw_vs_servers.py" in md
    # one server has no level1: every algorithm gives level0's figure
    for preset in bb.PRESETS:
        one = results[(preset, 1 << 20)][0]["cells"]
        assert len({c[0] for c in one.values() if c[0] is not None}) == 1
    # HCCL's substitutions are named, never plotted as the requested algorithm
    a910 = results[("atlas800-910a", 1 << 20)][1]["cells"]
    a3 = results[("atlas900-a3", 1 << 20)][1]["cells"]
    assert a910["pipeline"][1] == "H-D_R" and a3["H-D_R"][1] == "NHR" and a3["pipeline"] == (None, "not run by HCCL")
    assert "(ran H-D_R)" in md and "(ran NHR)" in md and "not run by HCCL" in md
    est = hccl_sim.simulate("allreduce", 1 << 20, topology=hccl_sim.topology("atlas800t-a2", servers=2), algo="NB")
    assert results[("atlas800t-a2", 1 << 20)][1]["cells"]["NB"][0] == est.busbw
    assert "| 2 | 16 | " in md and f"{est.busbw:.2f}" in md
