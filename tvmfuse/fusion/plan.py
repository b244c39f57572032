"""The fusion plan as a value: what tvmfuse's fusion decided, carried with the module it made.

`FuseGroupsTE` (fusion/fuse_groups_te.py) returns its decisions as one `Plan`:
  - `groups`: every group of every dataflow block (singletons too), with its ops, their classes,
    what kind of group it is, how it was merged, and the PrimFunc it became (`kernel`);
  - `refused`: every candidate merge left undone, as a `Refusal` (the rule that said no, and why);
  - groups the planner accepted but TE lowering refused (`te_refused` set on the group: its ops
    stay unfused, one kernel each).
The pass stamps the plan on the module (`tvmfuse.plan`, JSON) and each fused PrimFunc with its
group (`tvmfuse.group`), so `Plan.of(mod)` reads it back from any later stage of that build;
`Compiled.plan` keeps it. `explain`, `viz` and the report read a plan; none plans again.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .classify import COMPUTE, OPAQUE, REDUCTION

MODULE_ATTR = "tvmfuse.plan"
FUNC_ATTR = "tvmfuse.group"


@dataclass(frozen=True)
class Refusal:
    """A merge the planner did not make: groups `a` and `b` (op var names) of dataflow block `block`,
    `kind` "edge" (producer -> consumer) or "sibling" (readers of one input), the rule that said no
    (a legality rule, "cycle" or "profitability"), and why."""
    block: int
    a: tuple
    b: tuple
    kind: str
    rule: str
    reason: str


@dataclass
class Group:
    id: str  # "b<block>g<index>": the numbering explain, viz and the report share
    block: int
    index: int
    ops: tuple  # ((var name, op, class), ...) in block order
    kind: str  # group_kind() of the classes: "anchor + epilogue", "stitched reductions", ...
    merges: tuple = ()  # how it was formed: "edge" / "sibling" per merge, in merge order
    kernel: str | None = None  # the PrimFunc it became; None for a singleton (LegalizeOps makes it)
    te_refused: str | None = None  # planned, but TE lowering refused it: the reason (ops stay unfused)

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.ops]

    @property
    def fused(self) -> bool:
        return len(self.ops) > 1 and self.te_refused is None

    @property
    def kernels(self) -> int:
        """Kernels this group becomes: one when fused, else one per op."""
        return 1 if self.fused else len(self.ops)

    def attr(self) -> dict:
        """The `tvmfuse.group` attribute of its PrimFunc."""
        return {"id": self.id, "ops": ",".join(op for _, op, _ in self.ops),
                "classes": ",".join(c for _, _, c in self.ops), "kind": self.kind, "rule": self.rule}

    @property
    def rule(self) -> str:
        """The fusion rules that made the group: "producer-consumer", "sibling", or both."""
        kinds = [{"edge": "producer-consumer"}.get(m, m) for m in self.merges]
        return "+".join(dict.fromkeys(kinds)) or "single op"


@dataclass
class Plan:
    groups: list = field(default_factory=list)  # [Group], every block's, in block then group order
    refused: list = field(default_factory=list)  # [Refusal]
    blocks: list = field(default_factory=list)  # [ops in block] per dataflow block, in plan order

    def block_groups(self, block: int) -> list:
        return [g for g in self.groups if g.block == block]

    def block_refusals(self, block: int) -> list:
        return [r for r in self.refused if r.block == block]

    def kernels(self) -> int:
        return sum(g.kernels for g in self.groups)

    @property
    def te_refused(self) -> list:
        return [g for g in self.groups if g.te_refused]

    # ------------------------------------------------------------------ serialization
    def to_json(self) -> str:
        return json.dumps({"blocks": self.blocks, "groups": [asdict(g) for g in self.groups],
                           "refused": [asdict(r) for r in self.refused]},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        data = json.loads(text)
        groups = [Group(**{**g, "ops": tuple(tuple(o) for o in g["ops"]), "merges": tuple(g["merges"])})
                  for g in data["groups"]]
        refused = [Refusal(**{**r, "a": tuple(r["a"]), "b": tuple(r["b"])}) for r in data["refused"]]
        return cls(groups, refused, data["blocks"])

    @classmethod
    def of(cls, mod) -> "Plan | None":
        """The plan stamped on `mod` by FuseGroupsTE; None when no tvmfuse fusion ran on it."""
        attrs = mod.attrs
        if attrs is None or MODULE_ATTR not in attrs:
            return None
        return cls.from_json(str(attrs[MODULE_ATTR]))

    # ------------------------------------------------------------------ text
    def explain(self) -> str:
        """Every group with its ops and classes, every TE refusal and every refused merge."""
        lines = []
        for b, n_ops in enumerate(self.blocks):
            groups = self.block_groups(b)
            kernels = sum(g.kernels for g in groups)
            lines.append(f"block {b}: {n_ops} ops -> {kernels} kernels")
            for g in groups:
                ops = ", ".join(f"{n}:{op}[{c}]" for n, op, c in g.ops)
                head = f"  group {g.index} ({len(g.ops)} ops"
                head += f", {g.kind}, {g.rule} -> {g.kernel})" if g.fused else ")"
                lines.append(f"{head}: {ops}")
                if g.te_refused:
                    lines.append(f"  refused by TE lowering: group {g.index} stays {len(g.ops)} kernels: {g.te_refused}")
            for r in self.block_refusals(b):
                lines.append(f"  refused {r.kind} {list(r.a)} + {list(r.b)}: [{r.rule}] {r.reason}")
        return "\n".join(lines)


def group_kind(classes) -> str:
    """A short name for what a group of op classes is, e.g. 'anchor + epilogue'."""
    classes = list(classes)
    if len(classes) == 1:
        return f"single {classes[0]}"
    n_red = sum(c == REDUCTION for c in classes)
    if COMPUTE in classes:
        return "anchor + epilogue"
    if n_red > 1:
        return "stitched reductions"
    if n_red == 1:
        return "reduction + pointwise"
    if OPAQUE in classes:
        return "opaque"
    return "pointwise chain"
