"""The CostModel a communicator prices on: its topology as the communicator's configuration and
faults change it (HCCL_INTER_HCCS_DISABLE's routes, a borrowed backup NIC, a fault plan's link state)."""
from __future__ import annotations

from hcomm.cost import CostModel, as_cost
from topologies.presets import with_aiv, with_backup_nics, without_inter_hccs


def effective_cost(topo, config, backup: tuple = ()):
    """The CostModel a communicator with `config` prices on: on an A3 SuperPoD with
    HCCL_INTER_HCCS_DISABLE=TRUE, that of the topology with RoCE between its servers; with
    `backup` dies on their partner's NIC, that of the borrowed routes; under a fault plan, in its
    link state (which also holds the retransmission rule a corrupted transfer needs)."""
    cost = as_cost(topo)
    params = cost.topology.params
    if config.inter_hccs_disable and params.get("superpod_of_server") is not None and params.get("inter_hccs", True):
        cost = as_cost(without_inter_hccs(cost.topology))
    if backup and tuple(backup) != cost.topology.params.get("backup_nics", ()):
        cost = as_cost(with_backup_nics(cost.topology, backup))
    faults = config.faults
    if faults is not None and (faults.link_state or faults.corrupt) and cost.link_state != faults.link_state:
        cost = CostModel.of(cost.topology, faults.link_state)
    return cost


def with_expansion(cost, expansion):
    """`cost` as an op HCCL expands this way prices on: "AIV" (one AIV kernel) on the preset's AIV
    variant (topologies.presets.with_aiv), in the same link state; otherwise `cost` itself."""
    if expansion != "AIV" or cost.topology.params.get("expansion") == "AIV":
        return cost
    return CostModel.of(with_aiv(cost.topology), cost.link_state)
