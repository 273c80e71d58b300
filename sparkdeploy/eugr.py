"""eugr/spark-vllm-docker v1 recipes, read as they are and mapped onto a sparkdeploy recipe.

An eugr recipe (https://github.com/eugr/spark-vllm-docker, recipes/README.md and run-recipe.py) is a YAML mapping
with `recipe_version`, `name`, `container`, a `command` (`vllm serve MODEL --flag {placeholder} ...`),
`defaults` for the placeholders, `env`, `mods`, `build_args`, `cluster_only`/`solo_only`. Here:

1. the placeholders take `defaults`, then `--set NAME=VALUE` (as eugr's `--port`/`--tp`/... overrides do);
2. the command must be one `vllm serve` call; its argv is read with the image's own vLLM flag list
   (images/vllm_cli.image_spec), and each setting the recipe schema knows becomes that field (model, served name,
   memory, context, KV dtype, compilation, TP/PP, executor backend); the rest stay as `vllm.extra_args`, which
   `up`/`recipes lint` check against the image's CLI like any recipe's;
3. what sparkdeploy sets itself (`--host`, `--port`, `--distributed-executor-backend`, TP/PP sizes) and what
   has no place in a recipe is listed in `Imported.not_carried`, never dropped without a word;
4. a mod, build_arg or container with no sparkdeploy equivalent is refused, one line naming it: a patch the
   model needs would otherwise be lost silently.

`recipes.load_recipe` calls `to_recipe_data` for any file with `recipe_version` (one place), so `run-recipe FILE`,
`up -r FILE`, `recipes show FILE` and `recipes import FILE` all read eugr recipes the same way.
"""

from __future__ import annotations

import re
import shlex
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkdeploy.errors import ConfigError, Problem, escape_controls
from sparkdeploy.images.definitions import definition_names, load_definition
from sparkdeploy.images.vllm_cli import image_spec
from sparkdeploy.paths import confined
from sparkdeploy.schema import problems_from_validation
from sparkdeploy.userfile import JsonSyntaxError, parse_json

SUPPORTED_VERSIONS = ("1",)
MARKER = "recipe_version"  # a recipe file with this key is eugr's; sparkdeploy's own never has it

# eugr's container tags (built by its build-and-copy.sh) -> the sparkdeploy image definition that carries the
# same thing. Any other container is refused with the fix `--set container=IMAGE`.
CONTAINERS = {
    "vllm-node": "vllm-node",
    "vllm-node-mxfp4": "vllm-node-mxfp4",
}
# eugr build_args -> what they mean for sparkdeploy: an image to use instead (None: no effect on what runs).
BUILD_ARGS: dict[str, str | None] = {
    "--exp-mxfp4": "vllm-node-mxfp4",  # eugr's MXFP4 Dockerfile (christopherowen's fork): sparkdeploy's mxfp4 image
    "--use-wheels": None,  # how eugr builds the same image (prebuilt wheels): nothing changes at run time
}
# eugr mods (mods/<name>: scripts that patch vLLM inside the container before it starts) that an image
# definition of sparkdeploy already carries. sparkdeploy patches images only at build time (images/*/patches).
MODS: dict[str, str] = {}

# vllm serve flags (by argparse dest) that become recipe fields; the value is the field's dotted path.
FIELDS = {
    "served_model_name": "served_model_name",
    "gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "max_model_len": "vllm.max_model_len",
    "kv_cache_dtype": "vllm.kv_cache_dtype",
    "enforce_eager": "vllm.enforce_eager",
    "max_num_batched_tokens": "vllm.max_num_batched_tokens",
    "max_num_seqs": "vllm.max_num_seqs",
    "quantization": "vllm.quantization",
    "load_format": "vllm.load_format",
    "dtype": "vllm.dtype",
    "trust_remote_code": "vllm.trust_remote_code",
}
# Flags sparkdeploy writes itself for each topology and node (vllm_args.serve_args): taken out of the argv.
SET_BY_SPARKDEPLOY = {
    "host": "sparkdeploy binds 0.0.0.0",
    "port": "sparkdeploy serves on the inventory's vllm_port",
    "tensor_parallel_size": "the topology sets it (recipe tensor_parallel)",
    "pipeline_parallel_size": "the topology sets it from the inventory's nodes",
    "distributed_executor_backend": "the topology's backend sets it (cluster_backend)",
}
SHELL_OPERATORS = {";", "&&", "||", "|", "&", ">", ">>", "<", "$(", "`"}
PLACEHOLDER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EugrRecipe(BaseModel):
    """eugr's v1 schema (run-recipe.py load_recipe). Unknown keys are refused: a field this reader does not know
    may change what runs, so it is never ignored."""

    model_config = ConfigDict(extra="forbid")

    recipe_version: str
    name: str
    container: str
    command: str
    description: str = ""
    model: str | None = None
    mods: list[str] = Field(default_factory=list)
    defaults: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, Any] = Field(default_factory=dict)
    build_args: list[str] = Field(default_factory=list)
    cluster_only: bool = False
    solo_only: bool = False

    @field_validator("recipe_version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> Any:
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("mods", "build_args", "defaults", "env", mode="before")
    @classmethod
    def _empty(cls, v: Any, info: Any) -> Any:  # eugr writes `env:` with only comments under it (None)
        if v is None:
            return {} if info.field_name in ("defaults", "env") else []
        return v

    @field_validator("recipe_version")
    @classmethod
    def _known_version(cls, v: str) -> str:
        if v not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"eugr recipe version {v!r} is not one this sparkdeploy reads ({', '.join(SUPPORTED_VERSIONS)}) "
                "| fix: use a v1 recipe, or update sparkdeploy"
            )
        return v


@dataclass
class Imported:
    """A sparkdeploy recipe (its data, before validation) made from an eugr recipe, and what did not carry."""

    data: dict[str, Any]
    source: Path
    eugr_name: str
    not_carried: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)  # the `vllm serve` argv after substitution


def is_eugr(data: Any) -> bool:
    return isinstance(data, dict) and MARKER in data


def parse(data: dict, source: str) -> EugrRecipe:
    try:
        return EugrRecipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, source, EugrRecipe)) from None


def placeholders(command: str, source: str) -> list[str]:
    """The `{name}` fields of the command (str.format syntax, `{{`/`}}` are literal braces)."""
    names = []
    try:
        parsed = list(string.Formatter().parse(command))
    except ValueError as exc:
        raise ConfigError(
            Problem(source, "command", f"not a valid template: {exc}", "write {{ and }} for literal braces")
        ) from None
    for _, name, spec, conv in parsed:
        if name is None:
            continue
        if not PLACEHOLDER_NAME.fullmatch(name) or spec or conv:
            raise ConfigError(
                Problem(
                    source,
                    "command",
                    f"placeholder {{{name}}} is not a plain name",
                    "use {name} with a key of defaults (no attributes, indexes or format specs)",
                )
            )
        names.append(name)
    return names


def substitute(recipe: EugrRecipe, params: dict[str, Any], source: str) -> str:
    """The command with its placeholders filled: defaults, then `params` (--set). A placeholder with no value
    is refused, naming it."""
    names = placeholders(recipe.command, source)
    values = {**recipe.defaults, **params}
    missing = [n for n in dict.fromkeys(names) if values.get(n) is None]
    if missing:
        raise ConfigError(
            [
                Problem(
                    source,
                    "command",
                    f"placeholder {{{name}}} has no value",
                    f"add {name}: VALUE under defaults, or pass --set {name}=VALUE",
                )
                for name in missing
            ]
        )
    shown = {k: _text(v) for k, v in values.items()}
    return recipe.command.format(**shown)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def serve_argv(command: str, source: str) -> list[str]:
    """The arguments after `vllm serve`, from a command that must be exactly one `vllm serve` call."""
    flat = re.sub(r"\\\r?\n", " ", command)
    try:
        argv = shlex.split(flat, comments=True)
    except ValueError as exc:
        raise ConfigError(
            Problem(source, "command", f"cannot be split into words: {exc}", "check its quotes")
        ) from None
    if argv[:2] != ["vllm", "serve"]:
        first = " ".join(argv[:2]) or "(empty)"
        raise ConfigError(
            Problem(
                source,
                "command",
                f"is not a `vllm serve` command (it starts with {first!r})",
                "sparkdeploy runs only `vllm serve MODEL ...`; put other steps in an image definition",
            )
        )
    ops = [a for a in argv if a in SHELL_OPERATORS or a.startswith(("$(", "`"))]
    if ops:
        raise ConfigError(
            Problem(
                source,
                "command",
                f"is more than one `vllm serve` call (shell operator {ops[0]!r})",
                "keep one `vllm serve MODEL ...`; put env variables under env:",
            )
        )
    return argv[2:]


def _flag_spec(image: str) -> dict[str, dict]:
    return dict(image_spec(load_definition(image))["flags"])


def _pairs(argv: list[str], flags: dict[str, dict]) -> tuple[list[str], list[tuple[str, str | None, str]]]:
    """argv -> (positionals, [(flag, value or None, dest)]); a flag this vLLM does not know keeps the next word
    as its value unless that word is a flag (lint names the unknown flag afterwards)."""
    positionals: list[str] = []
    out: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            i += 1
            continue
        flag, eq, inline = token.partition("=")
        info = flags.get(flag)
        if info is None and "." in flag and flags.get(flag.split(".", 1)[0]):  # --compilation-config.KEY VALUE
            base = flag.split(".", 1)[0]
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else None)
            out.append((flag, value, str(flags[base]["dest"]) + "." + flag.split(".", 1)[1]))
            i += 1 if eq else 2
            continue
        takes = info.get("takes_value", True) if info else not (i + 1 >= len(argv) or argv[i + 1].startswith("-"))
        if eq:
            out.append((flag, inline, str(info["dest"]) if info else ""))
            i += 1
        elif takes and i + 1 < len(argv):
            out.append((flag, argv[i + 1], str(info["dest"]) if info else ""))
            i += 2
        else:
            out.append((flag, None, str(info["dest"]) if info else ""))
            i += 1
    return positionals, out


def _set(data: dict, dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _number(value: str | None) -> Any:
    if value is None:
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _image(recipe: EugrRecipe, source: str) -> tuple[str, list[str]]:
    """The sparkdeploy image for the recipe's container and build_args, and notes; refuses what has no
    equivalent."""
    notes: list[str] = []
    problems: list[Problem] = []
    # eugr's own tags map to ours; a sparkdeploy image definition's name (--set container=vllm-node) is taken as is.
    image = CONTAINERS.get(recipe.container) or (recipe.container if recipe.container in definition_names() else None)
    for arg in recipe.build_args:
        if arg not in BUILD_ARGS:
            problems.append(
                Problem(
                    source,
                    "build_args",
                    f"{arg} has no sparkdeploy equivalent (it changes how eugr builds {recipe.container})",
                    "pick the sparkdeploy image that carries what it adds with --set container=IMAGE and drop it "
                    "with --set build_args=[]",
                )
            )
            continue
        wanted = BUILD_ARGS[arg]
        if wanted:
            notes.append(f"build_args {arg}: sparkdeploy image {wanted}")
            image = wanted
        else:
            notes.append(f"build_args {arg}: how eugr builds its image; nothing changes at run time")
    if image is None:
        problems.append(
            Problem(
                source,
                "container",
                f"{recipe.container!r} is not an image sparkdeploy knows (eugr's tags it maps: "
                f"{', '.join(sorted(CONTAINERS))})",
                "pass --set container=IMAGE with a sparkdeploy image definition (sparkdeploy images list)",
            )
        )
    for mod in recipe.mods:
        if mod in MODS:
            notes.append(f"mods {mod}: carried by image {MODS[mod]}")
            image = MODS[mod]
            continue
        problems.append(
            Problem(
                source,
                "mods",
                f"{mod} has no sparkdeploy equivalent (sparkdeploy patches images when it builds them, not "
                "containers when they start)",
                "run without it with --set mods=[] if the model does not need it, or add its patch to an image "
                "definition (images/<name>/patches)",
            )
        )
    if problems:
        raise ConfigError(problems)
    assert image is not None
    return image, notes


EUGR_FIELDS = frozenset(EugrRecipe.model_fields)


def split_sets(raw: dict, set_values: list[tuple[str, Any]]) -> tuple[dict, dict, list[tuple[str, Any]]]:
    """--set values for an eugr recipe: an eugr field (container, mods, ...) replaces it in the eugr data, a
    placeholder name (or a defaults key) is a parameter, anything else (vllm.x, tensor_parallel) applies to the
    sparkdeploy recipe made from it, as for any recipe."""
    data = dict(raw)
    params: dict[str, Any] = {}
    rest: list[tuple[str, Any]] = []
    command = data.get("command") if isinstance(data.get("command"), str) else ""
    try:
        names = {n for _, n, _, _ in string.Formatter().parse(command or "") if n}
    except ValueError:
        names = set()
    defaults = data.get("defaults") if isinstance(data.get("defaults"), dict) else {}
    for key, value in set_values:
        if key in names or key in (defaults or {}):
            params[key] = value
        elif key in EUGR_FIELDS:
            data[key] = value
        else:
            rest.append((key, value))
    return data, params, rest


def to_recipe_data(raw: dict, path: Path, params: dict[str, Any] | None = None) -> Imported:
    """The sparkdeploy recipe data for an eugr recipe file (validated later, as any recipe's)."""
    source = str(path)
    recipe = parse(raw, source)
    command = substitute(recipe, params or {}, source)
    argv = serve_argv(command, source)
    image, notes = _image(recipe, source)
    flags = _flag_spec(image)
    positionals, pairs = _pairs(argv, flags)

    model = positionals[0] if positionals else None
    data: dict[str, Any] = {}
    extra: list[str] = []
    tp = pp = 1
    backend: str | None = None
    comp: dict[str, Any] = {}
    for flag, value, dest in pairs:
        if dest == "model":
            model = value
        elif dest in FIELDS:
            taken = True if value is None else _number(value)
            if dest == "served_model_name" and isinstance(taken, str):
                taken = taken.split()[0]
            _set(data, FIELDS[dest], taken)
        elif dest == "tensor_parallel_size":
            tp = int(_number(value) or 1)
        elif dest == "pipeline_parallel_size":
            pp = int(_number(value) or 1)
        elif dest == "distributed_executor_backend":
            backend = value
            notes.append(f"{flag} {value}: {SET_BY_SPARKDEPLOY[dest]}")
        elif dest in SET_BY_SPARKDEPLOY:
            notes.append(f"{flag} {value}: {SET_BY_SPARKDEPLOY[dest]}")
        elif dest == "compilation_config" and value is not None:
            try:
                loaded = parse_json(value, source, "command", f"write {flag} as a JSON object")
            except JsonSyntaxError:
                loaded = None
            if not isinstance(loaded, dict):
                raise ConfigError(
                    Problem(source, "command", f"{flag} {value!r} is not a JSON object", "write it as JSON")
                )
            comp.update(loaded)
        elif dest.startswith("compilation_config."):
            comp[dest.split(".", 1)[1]] = _number(value)
        else:
            extra += [flag] if value is None else [flag, value]
    if len(positionals) > 1:
        raise ConfigError(Problem(source, "command", f"more than one model: {' '.join(positionals)}", "name one model"))
    model = model or recipe.model
    if not model:
        raise ConfigError(Problem(source, "command", "names no model", "write `vllm serve ORG/MODEL ...`"))
    if recipe.model and recipe.model != model:
        notes.append(f"model {recipe.model} (for eugr's --setup download): the command serves {model}")
    if comp:
        mode = comp.pop("cudagraph_mode", None)
        data.setdefault("vllm", {})["compilation"] = {
            **({"cudagraph_mode": str(mode).upper()} if mode is not None else {}),
            **({"extra": comp} if comp else {}),
        }
    if extra:
        data.setdefault("vllm", {})["extra_args"] = extra

    if recipe.solo_only:
        topologies, default = ["solo", "2xsolo"], "solo"
    elif recipe.cluster_only:
        topologies, default = ["cluster"], "cluster"
    else:
        topologies, default = ["solo", "cluster", "2xsolo"], ("cluster" if tp * pp > 1 else "solo")
    if recipe.solo_only and tp * pp > 1:
        raise ConfigError(
            Problem(
                source,
                "solo_only",
                f"solo_only, but the command asks for TP={tp} x PP={pp} (one Spark has one GPU)",
                "set tensor_parallel to 1, or drop solo_only",
            )
        )
    description = " ".join((recipe.description or recipe.name).split())[:500]
    out: dict[str, Any] = {
        "name": _plain(path.stem),
        "description": description,
        "model": model,
        "image": image,
        "topologies": topologies,
        "default_topology": default,
        "fits_one_node": not recipe.cluster_only,
    }
    if "served_model_name" in data:
        out["served_model_name"] = data.pop("served_model_name")
    if backend in ("ray",):
        out["cluster_backend"] = "ray"
    elif backend in ("mp", "external_launcher"):
        out["cluster_backend"] = "native"
    if tp > 1 or pp > 1:
        out["tensor_parallel"] = tp
    if pp > 1:
        notes.append(
            f"pipeline_parallel {pp}: cluster splits the inventory's nodes into stages of {tp} "
            f"(PP = nodes / {tp}; eugr's recipe was written for {tp * pp} nodes)"
        )
    out.update(data)
    if recipe.env:
        out["env"] = {k: _text(v) for k, v in recipe.env.items()}
    return Imported(data=out, source=path, eugr_name=recipe.name, not_carried=notes, argv=argv)


def _plain(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "eugr-recipe"
    return name[:128]


# -- `sparkdeploy recipes import` ---------------------------------------------------------------------------


def comment(text: str) -> str:
    """One YAML comment line: every line break and other control character in `text` escaped (\\n), so a value
    from the community recipe (a default, the file name, a flag's value) can never end the comment and start a
    line of live YAML."""
    return f"# {escape_controls(text)}"


def header(imported: Imported) -> str:
    lines = [
        comment(f"Imported by `sparkdeploy recipes import` from the eugr v1 recipe {imported.source.name}"),
        comment(
            f"({imported.eugr_name!r}, eugr/spark-vllm-docker format). Its `vllm serve` command after substitution:"
        ),
        comment(f"  vllm serve {shlex.join(imported.argv)}")[:400],
    ]
    if imported.not_carried:
        lines.append(comment("Not carried over as written:"))
        lines += [comment(f"  - {note}") for note in imported.not_carried]
    return "\n".join(lines) + "\n"


def render_import(imported: Imported) -> str:
    """The sparkdeploy recipe file: the header comment, then the recipe written by the YAML serializer."""
    body = yaml.safe_dump(imported.data, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)
    return header(imported) + body


def import_file(imported: Imported, out_dir: Path, dry_run: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Write the imported recipe (validated by the caller) as OUT_DIR/<name>.yaml, refusing to replace a file
    unless told, or only say what would be written."""
    source = str(imported.source)
    target = confined(out_dir, f"{imported.data['name']}.yaml", "name")
    if not dry_run:
        if not out_dir.is_dir():
            raise ConfigError(Problem(str(out_dir), "--out", "is not a folder", "create it, or pass another --out"))
        if target.exists() and not overwrite:
            raise ConfigError(
                Problem(str(target), "", "exists already", "pass --force to replace it, or another --out folder")
            )
    text = render_import(imported)
    if not dry_run:
        target.write_text(text)
    return {
        "source": source,
        "recipe": imported.data["name"],
        "file": str(target),
        "written": not dry_run,
        "not_carried": list(imported.not_carried),
        "text": text,
    }
