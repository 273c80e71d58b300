"""`sparkdeploy recipes import FILE`: a recipe in another project's format, written as a sparkdeploy recipe.

Formats: eugr/spark-vllm-docker v1 (eugr.py), and spark-arena/sparkrun v2 recipes of SGLang or llama.cpp
(sparkrun.py). The recipe is read exactly as `run-recipe FILE` reads it (recipes.read_any), validated as any
recipe, and its extra flags are checked before anything is written: vLLM's against its image's CLI
(images/vllm_cli.check_args, the check `up` makes), SGLang's and llama.cpp's against their pinned parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.vllm_cli import check_args
from sparkdeploy.recipes import eugr
from sparkdeploy.recipes import recipe as recipes
from sparkdeploy.recipes.engines.registered import engine_of


def import_recipe(
    file: str, sets: list[str] | tuple[str, ...] = (), out_dir: str = ".", dry_run: bool = False, force: bool = False
) -> dict[str, Any]:
    path = Path(file)
    if not path.is_file():
        raise ConfigError(Problem(file, "", "no such file", "pass the path of an eugr recipe (*.yaml)"))
    data, rest, imported = recipes.read_any(path, recipes.parse_set(sets))
    if imported is None:
        raise ConfigError(
            Problem(
                file,
                eugr.MARKER,
                "missing: not an eugr v1 recipe, nor a sparkrun recipe of sglang or llama-cpp (a sparkdeploy recipe "
                "needs no import)",
                "run it as it is: sparkdeploy run-recipe FILE",
            )
        )
    for key, value in rest:  # --set vllm.x=... applies to the written recipe
        recipes._set_dotted(data, key, value)
    if imported.fmt == "sparkrun" and data.get("engine") == "llamacpp" and not data["llamacpp"].get("gguf"):
        raise ConfigError(
            Problem(
                file,
                "model",
                f"{imported.not_carried[-1]}",
                "pass --set llamacpp.gguf=FILE to recipes import",
            )
        )
    recipe = recipes.validate(data, str(path))
    if recipe.engine == "vllm":
        check_args([recipe.model, *recipe.vllm.extra_args], load_definition(recipe.image), str(path))
    else:  # SGLang's and llama.cpp's flags are their pinned parser's (images/engine-args/)
        engine = engine_of(recipe)
        engine.check_args(engine.extra_args(recipe), None, str(path))
    imported.data = data
    return eugr.import_file(imported, Path(out_dir).expanduser(), dry_run=dry_run, overwrite=force)
