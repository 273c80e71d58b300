"""inventory.*: the inventory loads (IPs only, no duplicates, one fabric subnet) and the recipe renders.

A bad inventory is a ConfigError everywhere else (exit 2). Doctor reports each problem as a failed
`inventory.valid` row with its fix, runs nothing else (there is nothing trustworthy to connect to), and exits 2
like every other command: it is a configuration error, not a node that failed a check.
"""

from __future__ import annotations

from sparkdeploy.checks import FAIL, Result, fail, ok, skip

from .doctor_run import DoctorRun


def valid(run: DoctorRun) -> list[Result]:
    if run.inventory_error is not None:
        return [
            Result(
                FAIL,
                f"{p.field}: {p.message}" if p.field else p.message,
                "a valid inventory",
                p.fix or "fix the inventory",
                detail=p.file,
            )
            for p in run.inventory_error.problems
        ]
    inv = run.inventory
    nets = sorted({str(n.fabric_network) for n in inv.nodes})  # type: ignore[union-attr]  # loaded: checked above
    return [
        ok(
            f"{len(inv.nodes)} node(s), IPs only, no duplicates, fabric subnet {', '.join(nets)}, head {inv.head.name}",  # type: ignore[union-attr]  # loaded: checked above
            "IPs only, unique, one fabric subnet",
            detail=inv.source,  # type: ignore[union-attr]  # loaded: checked above
        )
    ]


def recipe(run: DoctorRun) -> list[Result]:
    if run.deployment_error is not None:
        return [
            fail(
                f"{p.field}: {p.message}" if p.field else p.message,
                "the recipe renders for this inventory",
                p.fix or "fix the recipe or pass another --recipe/--topology",
                detail=p.file,
            )
            for p in run.deployment_error.problems
        ]
    d = run.deployment
    if d is None:
        return [skip("no recipe: pass --recipe NAME or set cluster.default_recipe (recipe checks are skipped)")]
    sim = next((w for w in d.warnings if w.startswith("SIMULATED")), "")
    return [
        ok(
            f"{d.recipe.name} / {d.topology}{' / ' + d.backend if d.topology == 'cluster' else ''}: "
            f"image {d.image_tag}",
            "renders",
            simulated=bool(sim),
            detail=sim,
        )
    ]
