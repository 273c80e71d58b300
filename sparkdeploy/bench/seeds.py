"""Reference results shipped as data: the seeds' gpt-oss-120b topology tables (two DGX Sparks, llama-benchy
pp1024/tg128, c1..c64, Solo / Cluster TP=2 / 2xSolo simple-shuffle / 2xSolo least-busy), with their source."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from sparkdeploy.bench.store import BenchResult, Stat

SEED_FILE = "seed_gpt_oss_120b.json"


@dataclass
class Reference:
    name: str
    recipe: str
    model: str
    pp: int
    tg: int
    concurrency: list[int]
    variants: dict[str, str]
    setup: dict[str, Any]
    source: dict[str, Any]
    winner_as_published: dict[str, dict[str, str]]
    results: list[BenchResult]

    def describe(self) -> str:
        s = self.setup
        return (
            f"{self.name}: {s.get('hardware')}, {s.get('benchmark')} pp{self.pp}/tg{self.tg}, "
            f"{s.get('runs')} runs per level, {s.get('date')}"
        )


def _build(data: dict[str, Any]) -> Reference:
    setup = data["setup"]
    pp, tg = int(setup["pp"]), int(setup["tg"])
    meta = {
        "source": "reference",
        "reference": data["name"],
        "date": setup.get("date"),
        "vllm_version": setup.get("vllm_version"),
        "image": setup.get("image"),
        "runs": setup.get("runs"),
        "simulated": False,
    }
    cells: dict[tuple[str, int], dict[str, Stat]] = {}
    for metric, by_variant in data["metrics"].items():
        for variant, by_c in by_variant.items():
            for c, cell in by_c.items():
                cells.setdefault((variant, int(c)), {})[metric] = Stat(float(cell["mean"]), cell.get("std"))
    results = [
        BenchResult(
            recipe=data["recipe"],
            variant=v,
            pp=pp,
            tg=tg,
            concurrency=c,
            metrics=m,
            metadata=dict(meta, topology=v.split("-")[0]),
        )
        for (v, c), m in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    ]
    return Reference(
        name=data["name"],
        recipe=data["recipe"],
        model=data["model"],
        pp=pp,
        tg=tg,
        concurrency=[int(c) for c in data["concurrency"]],
        variants=data["variants"],
        setup=setup,
        source=data["source"],
        winner_as_published=data.get("winner_as_published", {}),
        results=results,
    )


@cache
def seed_reference() -> Reference:
    text = resources.files("sparkdeploy.bench").joinpath("data", SEED_FILE).read_text()
    return _build(json.loads(text))


def reference_for(
    recipe: str | None, pp: int | None = None, tg: int | None = None, model: str | None = None
) -> Reference | None:
    """The shipped reference measured for that recipe, or for that model (the served model of the results it is
    compared with: a sweep of another recipe of gpt-oss-120b compares with the seeds' tables of it), at that pp/tg
    when given; else None."""
    ref = seed_reference()
    if recipe is not None and recipe != ref.recipe and (model is None or model != ref.model):
        return None
    if (pp is not None and pp != ref.pp) or (tg is not None and tg != ref.tg):
        return None
    return ref
