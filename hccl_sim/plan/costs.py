"""The CostModel a communicator prices on: its topology as the communicator's configuration and
faults change it (HCCL_INTER_HCCS_DISABLE's routes, a borrowed backup NIC, a fault plan's link state)."""
from __future__ import annotations

from hcomm.cost import CostModel, as_cost
from topologies.presets import with_backup_nics, with_detour, with_kernel, without_inter_hccs


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


def priced_as(cost, choice):
    """`cost` as `choice` runs on it: an op HCCL runs as one "AIV" or "CCU" kernel on the preset's
    variant for that engine (topologies.presets.with_kernel), the 950's Z-axis detour on the
    variant whose server mesh pairs detour over the Clos (topologies.presets.with_detour); in the
    same link state. Otherwise `cost` itself."""
    topo = cost.topology
    expansion = choice.expansion
    if expansion is not None and topo.params.get("expansion") != expansion:
        topo = with_kernel(topo, expansion)
    if choice.detour is not None and topo.params.get("detour") != choice.detour:
        topo = with_detour(topo, *choice.detour)
    return cost if topo is cost.topology else CostModel.of(topo, cost.link_state)
