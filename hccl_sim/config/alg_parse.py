"""HCCL_ALGO's executor grammar, parsed as the open-source HCCL parses it (docs/references.md §7.7).

The open-source HCCL (hicann/hccl `src/common/alg_parse.{h,cc}`, `HcclAlgoParser`) reads HCCL_ALGO
as a list of executor expressions, each optionally for one op, later entries taking priority:

    config        := segment ( ';' segment )* [';']
    segment       := [ OPTYPE ':' ] executor_expr
    executor_expr := 'not' '(' unit ')' | unit
    unit          := EXECUTOR '{' [ item ( ',' item )* ] '}'  |  TEMPLATE   (= sole{TEMPLATE})
    item          := [ 'level' N '=' ] ( 'not' '(' TEMPLATE ')' | TEMPLATE )

e.g. `allreduce:sequence{level0=mesh2die,level1=nhr};not(meshoneshot)`. Op and executor names are
read in any case; a template name also loses its underscores (`mesh_multi_link` is `meshmultilink`).
A `levelN=` item lands at index N of the template list, an item without one at its end, and the
gaps close up afterwards. An empty string parses to nothing. Every error is HCCL's E_PARA with
HCCL's own message text (`[HcclAlgoParser] ...`, with the 0-based position it stopped at).

What the parsed entries select is `hccl_sim.selection.executor_filter`'s business; this module only
reads the text.
"""
from __future__ import annotations

from dataclasses import dataclass

from topologies.errors import HcclError

# Names the grammar knows, lower case -> the fragment HCCL's algorithm names use (alg_parse.cc's
# ENGINE_TYPES, OP_TYPES, EXECUTOR_TYPES, ALGO_TYPES tables, copied as they are, quirks included:
# `pipeline` is PipeLine, and `nhrsinglechannel` names MeshSingleChannel).
ENGINE_TYPES = {"aicpu": "Aicpu", "aiv": "Aiv", "dpu": "Dpu", "ccums": "CcuMS", "ccusched": "CcuSched"}
OP_TYPES = {"allgather": "AllGather", "allgatherv": "AllGatherV", "allreduce": "AllReduce",
            "alltoall": "AllToAll", "alltoallv": "AllToAllV", "alltoallvc": "AllToAllVC",
            "broadcast": "Broadcast", "reduce": "Reduce", "reducescatter": "ReduceScatter",
            "reducescatterv": "ReduceScatterV", "scatter": "Scatter"}
EXECUTOR_TYPES = {"sole": "Sole", "sequence": "Sequence", "parallel": "Parallel", "pipeline": "PipeLine",
                  "concur": "Concur", "strictordered": "StrictOrdered"}
ALGO_TYPES = {"mesh": "Mesh", "mesh2die": "Mesh2Die", "meshoneshot": "MeshOneShot", "meshtwoshot": "MeshTwoShot",
              "meshconcur": "MeshConcur", "meshmultilink": "MeshMultiLink", "meshchunk": "MeshChunk",
              "meshchunktwoshot": "MeshChunkTwoShot", "nhr": "NHR", "nhrmultilink": "NHRMultiLink",
              "nhraicpureduce": "NHRAicpuReduce", "nhrsinglechannel": "MeshSingleChannel",
              "meshconcurrent": "MeshConcurrent"}

STANDARD_FORMAT = '"opType:executorType{level0=algoType, level1=algoType, level2=algoType};..."'
UINT32_MAX = (1 << 32) - 1
ULONG_MAX = (1 << 64) - 1
_IDENT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_SPACE = frozenset(" \t\n\v\f\r")      # C's isspace in the "C" locale


@dataclass(frozen=True)
class Template:
    """One level's template (`HcclAlgo`): its lower-case name and whether it is wanted (not negated)."""
    name: str
    enabled: bool = True

    def text(self) -> str:
        return self.name if self.enabled else f"not({self.name})"


@dataclass(frozen=True)
class ExecutorEntry:
    """One executor expression (`HcclAlgoExecutor`): for op `op` ("" for every op), executor
    `executor` over `templates` (level0 first), wanted or negated as a whole."""
    op: str
    executor: str
    templates: tuple = ()
    enabled: bool = True

    def text(self) -> str:
        """The entry as HCCL's ToString writes it: [op:][not(]exec{level0=a,level1=not(b)}[)]."""
        body = ",".join(f"level{i}={t.text()}" for i, t in enumerate(self.templates))
        unit = f"{self.executor}{{{body}}}"
        return (f"{self.op}:" if self.op else "") + (unit if self.enabled else f"not({unit})")


def describe(entries) -> str:
    """HcclAlgoParser::ToString of a parse: what HCCL logs after "parse ok"."""
    return "HcclAlgoExecutorParser{ executorList=[" + "; ".join(e.text() for e in entries) + "] }"


def template_key(name: str) -> str:
    """A template name as HCCL compares it: ToLowerStr(UnderscoreToCamelCase(name))."""
    return name.replace("_", "").lower()


def parse_executor_config(text: str) -> tuple:
    """HCCL_ALGO `text` read by the executor grammar: a tuple of ExecutorEntry in the order given
    (the last applies first). HcclError E_PARA with HCCL's message when the text is not of it."""
    return _Parser(text).parse()


class _Parser:
    """Recursive descent over one string, mirroring AlgoParserImpl's methods one for one."""

    def __init__(self, text: str):
        self.s = text
        self.pos = 0

    # -- characters
    def skip_ws(self):
        while self.pos < len(self.s) and self.s[self.pos] in _SPACE:
            self.pos += 1

    def peek(self, ahead: int = 0) -> str:
        at = self.pos + ahead
        return self.s[at] if at < len(self.s) else ""

    def eat(self, char: str) -> bool:
        self.skip_ws()
        if self.peek() == char:
            self.pos += 1
            return True
        return False

    def identifier(self) -> str:
        self.skip_ws()
        start = self.pos
        while self.pos < len(self.s) and self.s[self.pos] in _IDENT:
            self.pos += 1
        return self.s[start:self.pos]

    def error(self, message: str) -> HcclError:
        return HcclError("E_PARA", f"HCCL_ALGO={self.s!r} is invalid: [HcclAlgoParser] {message}")

    def at_not(self) -> bool:
        """'not' (any case) then '(' after optional spaces; consumes both when so."""
        self.skip_ws()
        if self.s[self.pos:self.pos + 3].lower() != "not":
            return False
        after = self.pos + 3
        while after < len(self.s) and self.s[after] in _SPACE:
            after += 1
        if after < len(self.s) and self.s[after] == "(":
            self.pos = after + 1
            return True
        return False

    # -- grammar
    def parse(self) -> tuple:
        entries = []
        self.skip_ws()
        while self.pos < len(self.s):
            entries.append(self.segment())
            self.skip_ws()
            if self.peek() == ";":
                self.pos += 1
                self.skip_ws()
                continue
            if self.pos < len(self.s):
                raise self.error(f"parse algo config failed, standard format: {STANDARD_FORMAT}, "
                                 f"trailing chars at pos {self.pos}: [{self.s[self.pos:]}]")
        return tuple(entries)

    def segment(self) -> ExecutorEntry:
        start = self.pos
        name = self.identifier()
        self.skip_ws()
        op = ""
        if name and self.peek() == ":" and self.peek(1) != ":":
            op = name.lower()
            if op not in OP_TYPES:
                raise self.error(f"invalid opType [{op}] at pos {start}")
            self.pos += 1
        else:
            self.pos = start
        unit = self.executor_expr()
        return ExecutorEntry(op, unit.executor, unit.templates, unit.enabled)

    def executor_expr(self) -> ExecutorEntry:
        if self.at_not():
            unit = self.unit_or_atom()
            if not self.eat(")"):
                raise self.error(f"expected ')' after not(...) at pos {self.pos}")
            return ExecutorEntry("", unit.executor, unit.templates, False)
        return self.unit_or_atom()

    def unit_or_atom(self) -> ExecutorEntry:
        self.skip_ws()
        start = self.pos
        name = self.identifier()
        if not name:
            raise self.error(f"expected executor or template at pos {self.pos}")
        self.skip_ws()
        if self.peek() == "{":
            executor = name.lower()
            if executor not in EXECUTOR_TYPES:
                raise self.error(f"invalid executorType [{executor}] at pos {start}")
            self.pos += 1
            templates = self.template_list()
            if not self.eat("}"):
                raise self.error(f"expected '}}' at pos {self.pos}")
            return ExecutorEntry("", executor, templates)
        return ExecutorEntry("", "sole", (Template(self.known_template(name, start)),))

    def known_template(self, name: str, at: int) -> str:
        key = template_key(name)
        if key not in ALGO_TYPES:
            raise self.error(f"invalid algoType [{key}] at pos {at}")
        return key

    def template_list(self) -> tuple:
        # slots: index -> Template, as HCCL's vector resized to each levelN and appended to; the
        # gaps are dropped in index order at the end (CompactAlgoList). A dict, not a list: a
        # level of four billion is HCCL's to allocate, not ours.
        slots, length = {}, 0
        self.skip_ws()
        if self.peek() == "}":
            return ()
        while True:
            level, template = self.template_item()
            if level is None:
                level = length
            slots[level] = template
            length = max(length, level + 1)
            if not self.eat(","):
                break
        return tuple(slots[i] for i in sorted(slots))

    def template_item(self):
        self.skip_ws()
        start = self.pos
        name = self.identifier()
        digits = name[5:]
        if len(name) > 5 and name[:5].lower() == "level" and digits.isdigit() and digits.isascii():
            self.skip_ws()
            if self.peek() == "=":
                self.pos += 1
                level = int(digits)
                if level > ULONG_MAX:
                    raise self.error(f"invalid level: {digits}")
                if level > UINT32_MAX:
                    raise self.error(f"level {level} exceeds uint32_t range")
                return level, self.template_expr()
        self.pos = start
        return None, self.template_expr()

    def template_expr(self) -> Template:
        if self.at_not():
            self.skip_ws()
            name = self.template_atom()
            if not self.eat(")"):
                raise self.error(f"expected ')' after not(template) at pos {self.pos}")
            return Template(name, False)
        return Template(self.template_atom())

    def template_atom(self) -> str:
        self.skip_ws()
        start = self.pos
        name = self.identifier()
        if not name:
            raise self.error(f"expected template name at pos {self.pos}")
        return self.known_template(name, start)
