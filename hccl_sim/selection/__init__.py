"""Algorithm selection, apart from how algorithms are built (SimGrid SMPI's split).

`select` decides what runs for one collective call: the flat algorithm (synthetic topologies), or
HCCL's level0 and level1 (hardware presets). An explicit choice (the `algo=` argument, else
HCCL_ALGO's level1 token) runs as asked, or by one of HCCL's documented fallbacks, which is then
named in the label (`last_op.algo`) and logged; anything else is an HcclError naming what the
collective and topology support (`hccl.resolve_explicit`). Without one, the policy decides:
`hccl` (HCCL's own rules, selection/hccl.py) or `model` (the fastest by this emulator's timing
model, selection/model.py). HCCL_BIRS_ENABLE=TRUE decides a ReduceScatter before all of these
(selection/birs.py).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from topologies.errors import HcclError

from ..config.hccl_algo import ALGO_TOKENS, parse_hccl_algo
from ..algorithms import registry
from .. import collectives as colls
from . import birs, executor_choice, hccl, hccl_a3, model, scatter, variable

log = logging.getLogger("hccl_sim.selection")

POLICIES = {"hccl": hccl.choose, "model": model.choose}
_ALIASES = {"hd": "H-D_R", "h-d": "H-D_R", "rhd": "H-D_R", "h-d_r": "H-D_R", "nhr": "NHR", "nb": "NB",
            "mesh": "fullmesh", "ring": "ring", "star": "star", "pipeline": "pipeline", "pairwise": "pairwise",
            "fullmesh": "fullmesh"}


class Choice(NamedTuple):
    """What runs: one flat algorithm, or level0 + level1 (+ level2 on an A3 SuperPoD) of the
    hierarchy, and why if not as asked."""
    flat: bool
    level0: Optional[str]
    level1: Optional[str]
    note: Optional[str] = None
    level2: Optional[str] = None
    expansion: Optional[str] = None       # "AIV" / "CCU": HCCL runs the op as one such kernel (priced on with_kernel)
    executor: Optional[str] = None        # HCCL's algorithm name where it names one (the 950: AicpuAllReduceSoleNHR)
    # The 950's Parallel executor: the share of the data that runs the levels in order (the rest
    # runs them across servers first, at the same time); None: one part
    split: Optional[float] = None
    # The 950's Z-axis detour (its MeshConcur executors): (the share of a level0 pair's bytes over
    # its mesh link, the level0 peers each rank exchanges with at once); priced on
    # topologies.presets.with_detour. None: the mesh alone.
    detour: Optional[tuple] = None
    # The 950's Parallel executors of three UBoE levels: level0 a whole SuperPoD, level1 across
    # SuperPoDs (superpod.Pods.squeezed)
    squeezed: bool = False
    # The 950's PipeLine AllGather: HCCL's OmniPipe pieces (algorithms.omnipipe)
    pipelined: bool = False

    @property
    def structure(self) -> tuple:
        """What the program depends on (the note does not change a single step)."""
        return (self.flat, self.level0, self.level1, self.level2, self.split, self.squeezed, self.pipelined)

    @property
    def label(self) -> str:
        if self.flat:
            text = self.level1
        else:
            # the levels that run: a server of one die has no level0, one server no level1
            levels = [f"level{i}:{algo}" for i, algo in enumerate((self.level0, self.level1, self.level2))
                      if algo is not None]
            text = ";".join(levels) or "one rank: a local copy"
        if self.executor is not None:
            text = f"{self.executor}: {text}"
        if self.expansion is not None:
            text = f"{text} [{self.expansion}]"
        return text if self.note is None else f"{text} ({self.note})"


@dataclass
class Context:
    """One call to select for: the call, where it runs, and how to price a candidate."""
    name: str                      # canonical collective name
    signature: object              # planner.Signature
    topo: object
    config: object
    itemsize: int
    servers: object                # algorithms.hierarchy.Servers
    price: Callable                # Choice -> makespan in ns on this emulator's timing model
    cache: dict                    # the cost model's cache for policy decisions
    pods: object = None            # algorithms.superpod.Pods on an A3 SuperPoD, else None
    call: object = None            # the call's own signature (a variable-size op's counts), if not `signature`

    @property
    def flat(self) -> bool:
        return not self.topo.device_model.hierarchical      # a synthetic preset: one flat level

    @property
    def own_signature(self):
        """The call as made: a variant's own name and counts (`signature` is sized for the
        collective it selects as)."""
        return self.signature if self.call is None else self.call


def requested_token(name: str, algo, config, level: str = "level1") -> Optional[str]:
    """The token asked for at `level` by `algo=` (a token, for level1, or a whole HCCL_ALGO
    string) or HCCL_ALGO."""
    if algo is not None:
        if not isinstance(algo, str):
            raise HcclError("E_PARA", f"algo must be a string, got {type(algo).__name__}")
        if ":" in algo:
            return parse_hccl_algo(algo, source="algo").levels_for(name).get(level)
        if level != "level1":
            return None
        token = algo if algo in ALGO_TOKENS or algo in registry.ALGORITHMS else _ALIASES.get(algo.lower())
        if token is None:
            known = sorted(set(ALGO_TOKENS) | set(registry.ALGORITHMS))
            raise HcclError("E_PARA", f"unknown algorithm {algo!r}; expected an HCCL token or algorithm "
                            f"({', '.join(known)}) or an HCCL_ALGO string")
        return token
    return config.algo.levels_for(name).get(level)


_logged = set()


def _log_note(name, token, choice):
    key = (name, token, choice.note)
    if key not in _logged:
        _logged.add(key)
        log.warning("%s: %s", name, choice.label)


def _check_expansion(ctx) -> None:
    """HCCL_OP_EXPANSION_MODE is priced as itself where the preset models it (its
    `expansion_modes`); anywhere else the op is priced with the preset's default expansion, and
    that is said once. HOST_TS acts on 910B only: elsewhere HCCL itself warns and ignores it."""
    mode, dm = ctx.config.expansion, ctx.topo.device_model
    if mode is None or ctx.flat or mode in dm.expansion_modes:
        return
    key = ("expansion", ctx.topo.name, mode)
    if key in _logged:
        return
    _logged.add(key)
    default = dm.expansion_modes[0]
    if mode == "HOST_TS" and ctx.topo.device != "910B":
        text = (f"HCCL_OP_EXPANSION_MODE=HOST_TS changes nothing on {ctx.topo.name}: HCCL warns "
                f"\"deviceType do not support HOST_TS\" off 910B; ops run with its {default} expansion")
    else:
        text = (f"HCCL_OP_EXPANSION_MODE={mode} is not modelled on {ctx.topo.name} (it models "
                f"{', '.join(dm.expansion_modes)}): ops are priced with its {default} expansion")
    warnings.warn(text, UserWarning, stacklevel=2)


def _check_new_selector(ctx) -> None:
    """HCCL_USE_NEW_SELECTOR=1 off the 950: HCCL's cost-model selector is the open-source ops'
    (A5) path; A2's and A3's selection does not read it. Said once."""
    key = ("new selector", ctx.topo.name)
    if ctx.config.new_selector and not ctx.flat and key not in _logged:
        _logged.add(key)
        warnings.warn(f"HCCL_USE_NEW_SELECTOR=1 changes nothing on {ctx.topo.name} ({ctx.topo.device}): HCCL's "
                      "cost-model selector runs on the 950", UserWarning, stacklevel=3)


def _check_algo_grammar(ctx) -> None:
    """An HCCL_ALGO of the executor grammar on a device whose HCCL reads the legacy one only:
    E_NOT_SUPPORT naming the executors, never a silent fallback to HCCL's own choice."""
    algo = ctx.config.algo
    if algo.executors is not None and ctx.topo.device_model.algo_grammar == "legacy":
        raise algo.not_read_by(f"{ctx.topo.name} ({ctx.topo.device})", "level0:NA;level1:<algo>")


def select(ctx: Context) -> Choice:
    if ctx.topo.device_model.selector == "a5":              # the 950: the open-source HCCL's own selectors
        _check_expansion(ctx)
        birs.choose(ctx, None, None)                         # HCCL_BIRS_ENABLE's refusal off A3
        return _noted(ctx.name, None, executor_choice.choose(ctx))
    _check_new_selector(ctx)
    v_op = ctx.signature.name in variable.V_EXECUTORS      # AllGatherV, ReduceScatterV: their executors' rules
    if v_op:
        variable.check_device(ctx)
    choice = _select(ctx, v_op)
    if v_op and ctx.pods is None and not ctx.flat:
        choice = _noted(ctx.name, None, variable.adjusted(ctx, choice))
    return choice


def _select(ctx: Context, v_op: bool) -> Choice:
    _check_expansion(ctx)
    _check_algo_grammar(ctx)
    name = ctx.name
    if name == "barrier":
        return Choice(True, None, "dissemination")
    token = requested_token(name, ctx.signature.algo, ctx.config)
    if token in ("NA", "null"):
        token = None
    if ctx.config.birs:          # HCCL_BIRS_ENABLE=TRUE: HcclReduceScatter decides this before anything else
        token2 = requested_token(name, ctx.signature.algo, ctx.config, "level2")
        choice = birs.choose(ctx, token, None if token2 in ("NA", "null") else token2)
        if choice is not None:
            return _noted(name, token, choice)
    policy = POLICIES[ctx.config.policy]
    srv = ctx.servers
    if name == "scatter":
        return _noted(name, token, scatter.choose(ctx, token))
    if ctx.pods is not None and v_op:
        return _noted(name, token, variable.a3(ctx, token))
    if ctx.pods is not None:
        level2 = requested_token(name, ctx.signature.algo, ctx.config, "level2")
        choice = hccl_a3.choose(ctx, token, level2)
        return _noted(name, token, choice)
    if ctx.flat:
        if token is not None:
            algo, note = hccl.resolve_explicit(name, token, ctx, level="flat")
            if algo is not None:
                return _noted(name, token, Choice(True, None, algo, note))
            return _noted(name, token, Choice(True, None, policy(ctx, True, None), note))
        return Choice(True, None, policy(ctx, True, None))
    l0 = hccl.level0_for(ctx.topo, srv)
    if token is not None and (srv.m == 1 or (not srv.equal and name in ("reducescatter", "alltoall"))):
        hccl.resolve_explicit(name, token, ctx, level="level1")   # a token HCCL would refuse is refused here too
    if not srv.equal and name in ("reducescatter", "alltoall"):
        algo = "pairwise" if name == "alltoall" else "ring"
        note = None if token in (None, algo) else f"unequal servers: HCCL runs {name} flat with {algo}"
        return _noted(name, token, Choice(True, None, algo, note))
    if srv.m == 1:
        note = None if token is None else f"one server: no level1, {token} not used"
        return _noted(name, token, Choice(False, l0, None, note))
    if srv.K == 1:
        l0 = None
    note = None
    if token is not None:
        algo, note = hccl.resolve_explicit(name, token, ctx, level="level1")
        if algo is not None:
            return _noted(name, token, Choice(False, l0, algo, note))
    return _noted(name, token, Choice(False, l0, policy(ctx, False, l0), note))


def _noted(name, token, choice):
    if choice.note is not None:
        _log_note(name, token, choice)
    return choice
