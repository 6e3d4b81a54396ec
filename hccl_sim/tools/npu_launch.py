"""`hccl-sim torchrun [--topology NAME|FILE] [--servers N] TORCHRUN-OPTIONS SCRIPT.py [ARGS...]`:
torchrun a torch_npu program unchanged on emulated NPUs.

Every rank is `python -m hccl_sim.torch.npu_main SCRIPT.py ARGS` under torch's own torchrun
(`python -m torch.distributed.run`, given every other option as it is: --nproc-per-node,
--nnodes, --node-rank, --rdzv-*, --max-restarts, ...). The topology (default: the torch
backend's, HCCL_SIM_TOPOLOGY) is the one HCCL_SIM_TOPOLOGY names in the ranks; --servers N makes
it the preset with N servers. Under mpirun the same rank module runs as it is:
`mpirun -n 8 python -m hccl_sim.torch.npu_main SCRIPT.py`.
"""
from __future__ import annotations

import os
import subprocess
import sys

from topologies.errors import HcclError

USAGE = "hccl-sim torchrun [--topology NAME|FILE] [--servers N] [torchrun options] SCRIPT.py [ARGS...]"


def command(argv) -> tuple:
    """(the torchrun command line, the environment's changes) for `hccl-sim torchrun argv`."""
    argv, env = list(argv), {"HCCL_SIM_NPU": "1"}
    topology, servers = None, None
    while argv and argv[0] in ("--topology", "--servers"):
        if len(argv) < 2:
            raise HcclError("E_PARA", f"torchrun: {argv[0]} needs a value ({USAGE})")
        if argv[0] == "--topology":
            topology = argv[1]
        else:
            if not argv[1].isdigit() or int(argv[1]) < 1:
                raise HcclError("E_PARA", f"torchrun: --servers {argv[1]!r} is not a positive integer")
            servers = int(argv[1])
        argv = argv[2:]
    script = next((i for i, a in enumerate(argv) if a.endswith(".py") and not a.startswith("-")), None)
    if script is None:
        raise HcclError("E_PARA", f"torchrun: no SCRIPT.py given ({USAGE})")
    if not os.path.isfile(argv[script]):
        raise HcclError("E_PARA", f"torchrun: {argv[script]}: no such script")
    if topology is not None or servers is not None:
        name = topology or os.environ.get("HCCL_SIM_TOPOLOGY", "atlas800t-a2").partition(":")[0]
        env["HCCL_SIM_TOPOLOGY"] = name + (f":servers={servers}" if servers is not None else "")
    line = [sys.executable, "-m", "torch.distributed.run", *argv[:script], "-m", "hccl_sim.torch.npu_main",
            *argv[script:]]
    return line, env


def main(argv) -> int:
    line, env = command(argv)
    return subprocess.call(line, env={**os.environ, **env})
