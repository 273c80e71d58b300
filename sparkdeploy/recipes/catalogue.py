"""The recipe catalogue: one row per recipe (shipped and --recipes-dir) for `recipes list` and `recipes search`.

A row says what an owner picks a recipe by: the model, its weights in memory, whether it fits one DGX Spark,
the topologies it runs, its engine, the tool-call and reasoning parsers it serves with (the engine's `parsers`).
A file that does not load is a row with its problem, so one bad file never hides the others.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes import recipe as recipes_mod
from sparkdeploy.recipes.engines.registered import engine_of

PARSER_FLAGS = {"tool_call_parser": "--tool-call-parser", "reasoning_parser": "--reasoning-parser"}


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in an argv (`--flag V` or `--flag=V`), the last one winning as in argparse."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def row(name: str, recipe: recipes_mod.Recipe, file: str) -> dict[str, Any]:
    engine = engine_of(recipe)
    args = [str(a) for a in engine.extra_args(recipe)]
    parsers = engine.parsers(recipe)
    return {
        "name": name,
        "engine": engine.name,
        "model": recipe.model,
        "served_model_name": recipe.public_name,
        "weights_gb": recipe.weights_gb,
        "fits_one_node": recipe.fits_one_node,
        "topologies": list(recipe.topologies),
        "default_topology": recipe.default_topology,
        "cluster_backend": recipe.cluster_backend,
        "image": recipe.image,
        "max_model_len": engine.reservation(recipe).max_model_len,
        "tool_call_parser": parsers.tool,
        "reasoning_parser": parsers.reasoning,
        "auto_tool_choice": "--enable-auto-tool-choice" in args,
        "description": recipe.description,
        "file": file,
        "problems": [],
    }


def entries(recipes_dir: str | None = None) -> list[dict[str, Any]]:
    out = []
    for name, path in recipes_mod.recipe_files(recipes_dir).items():
        try:
            recipe, _, _ = recipes_mod.load_recipe(str(path))
        except ConfigError as exc:
            out.append({"name": name, "file": str(path), "problems": [str(p) for p in exc.problems]})
            continue
        out.append(row(name, recipe, str(path)))
    return out


def search(text: str, recipes_dir: str | None = None) -> list[dict[str, Any]]:
    """Rows whose name, model, served name, description, parsers or topologies contain every word of TEXT
    (case-insensitive): `search qwen coder`, `search glm47`, `search cluster 70b`."""
    words = text.lower().split()
    fields = (
        "name",
        "model",
        "served_model_name",
        "description",
        "tool_call_parser",
        "reasoning_parser",
        "image",
        "engine",
    )
    hits = []
    for entry in entries(recipes_dir):
        hay = " ".join(str(entry.get(f) or "") for f in fields) + " " + " ".join(entry.get("topologies") or [])
        if all(w in hay.lower() for w in words):
            hits.append(entry)
    return hits
