"""Which nodes form which engine, and whether the model allows that split: pure logic, no host touched.

A layout is a tensor-parallel size k (nodes per TP group) and the groups themselves. `cluster` runs one engine
over every group (pipeline parallel = number of groups), `replicas` one engine per group behind the proxy.
Groups come from the inventory's `groups:` when set, else from the node order (head first), k at a time.
vLLM numbers ranks TP-first (rank = pp_stage * tp + tp_rank), so a TP group is k consecutive ranks: the
nodes listed together, which on a switch should be the ones with the fastest path between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.recipes.recipe import ResolvedRecipe

DEFAULT_REPLICA_TP = 2  # four Sparks -> two TP=2 engines: the seeds' 2xsolo-vs-cluster lesson one level up


@dataclass(frozen=True)
class Layout:
    tp: int
    groups: tuple[tuple[Node, ...], ...]  # each group's first node is its rank 0

    @property
    def pp(self) -> int:
        return len(self.groups)

    @property
    def ranks(self) -> list[Node]:
        """Every node in rank order (cluster: the groups one after another)."""
        return [n for g in self.groups for n in g]

    def describe(self) -> str:
        return " | ".join("+".join(n.name for n in g) for g in self.groups)


def _head_first(inventory: Inventory) -> list[Node]:
    return sorted(inventory.nodes, key=lambda n: n.role != "head")


def plan(inventory: Inventory, resolved: ResolvedRecipe, default_tp: int | None = None) -> Layout:
    """The layout for cluster (default_tp None: every node in one TP group) or replicas (default_tp 2)."""
    recipe = resolved.recipe
    n = len(inventory.nodes)
    explicit = inventory.node_groups()
    tp_field = "tensor_parallel (--tp)"
    tp = recipe.tensor_parallel
    if explicit is not None:
        size = len(explicit[0])
        if tp is not None and tp != size:
            raise ConfigError(
                Problem(
                    inventory.source,
                    "groups",
                    f"groups of {size} nodes, but {tp_field} is {tp}",
                    f"use --tp {size}, or regroup the nodes {tp} by {tp}",
                )
            )
        tp = size
    if tp is None:
        tp = default_tp or n
        if tp > n:  # replicas on fewer nodes than one group needs: one engine over what there is
            tp = n
    if tp > n or n % tp:
        raise ConfigError(
            Problem(
                str(resolved.source),
                tp_field,
                f"TP={tp} does not split {n} nodes into whole groups",
                f"use a --tp that divides {n} ({', '.join(str(d) for d in range(1, n + 1) if n % d == 0)})",
            )
        )
    if explicit is not None:
        groups = [list(g) for g in explicit]
        head = inventory.head
        # The head's group goes first with the head as its rank 0: it serves the API (and runs the proxy).
        groups.sort(key=lambda g: head not in g)
        groups[0].sort(key=lambda node: node.name != head.name)
    else:
        nodes = _head_first(inventory)
        groups = [nodes[i : i + tp] for i in range(0, n, tp)]
    layout = Layout(tp, tuple(tuple(g) for g in groups))
    check_model(resolved, tp, layout.pp if default_tp is None else 1)
    return layout


def refusal(resolved: ResolvedRecipe, tp: int, pp: int) -> str | None:
    """Why the model cannot be split TP=tp x PP=pp (one line), or None when it can or is not described."""
    arch = resolved.recipe.architecture
    if arch is None:
        return None
    if arch.attention_heads % tp:
        return f"TP={tp} does not divide its {arch.attention_heads} attention heads"
    kv = arch.kv_heads
    if kv % tp and tp % kv:
        return (
            f"TP={tp} neither divides its {kv} KV heads nor is a multiple of them (vLLM splits or replicates "
            "whole KV heads)"
        )
    if pp > arch.layers:
        return f"PP={pp} exceeds its {arch.layers} layers"
    return None


def check_model(resolved: ResolvedRecipe, tp: int, pp: int) -> None:
    why = refusal(resolved, tp, pp)
    if why:
        arch = resolved.recipe.architecture
        heads = arch.attention_heads if arch is not None else 0  # without one, refusal() refuses every layout
        ok = [d for d in range(1, 65) if refusal(resolved, d, 1) is None and d <= heads][:6]
        raise ConfigError(
            Problem(
                str(resolved.source),
                "tensor_parallel (--tp)",
                f"{resolved.recipe.model} cannot run TP={tp} x PP={pp}: {why}",
                f"use --tp {' or '.join(str(d) for d in ok if d > 1) or 1} "
                "(pipeline parallel takes the remaining nodes)",
            )
        )
