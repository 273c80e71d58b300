"""eugr/spark-vllm-docker v1 recipes, read as they are and mapped onto a sparkdeploy recipe.

An eugr recipe (https://github.com/eugr/spark-vllm-docker, recipes/README.md and run-recipe.py) is a YAML mapping
with `recipe_version`, `name`, `container`, a `command` (`vllm serve MODEL --flag {placeholder} ...`),
`defaults` for the placeholders, `env`, `mods`, `build_args`, `cluster_only`/`solo_only`. Here:

1. the placeholders take `defaults`, then `--set NAME=VALUE` (as eugr's `--port`/`--tp`/... overrides do); a
   `solo_only` recipe gets `tensor_parallel` 1 unless --set gives it, as eugr's run-recipe.py does in solo mode;
2. the command must be one `vllm serve` call; its argv is read the way vLLM's own FlexibleArgumentParser reads
   it (`--a_b` is `--a-b`, `-O3` is `--optimization-level 3`, `--x.y.z V` is `--x '{"y": {"z": V}}'` with V typed
   as JSON, `--x.y+ A,B` a list) against the image's own vLLM flag list (images/vllm_cli.image_spec); each setting
   the recipe schema knows becomes that field (model, served name, memory, context, KV dtype, compilation, TP/PP,
   executor backend), the rest stay as `vllm.extra_args` in the image's spelling, dotted keys as one nested JSON;
3. what sparkdeploy sets itself (`--host`, `--port`, `--distributed-executor-backend`, TP/PP sizes) and what
   has no place in a recipe is listed in `Imported.not_carried`, never dropped without a word;
4. a mod, build_arg or container with no sparkdeploy equivalent is refused, one line naming it: a patch the
   model needs would otherwise be lost silently; so is what only a dropped mod provides (a parser, a flag, a file
   in eugr's container workspace such as a reasoning-parser plugin or a chat template);
5. every problem of a recipe is reported in one pass (unknown keys, placeholders, the command, the image, TP/PP
   and served name, flags and values the image's vLLM refuses, the recipe fields), one line each with its fix.

`recipes.load_recipe` calls `to_recipe_data` for any file with `recipe_version` (one place), so `run-recipe FILE`,
`up -r FILE`, `recipes show FILE` and `recipes import FILE` all read eugr recipes the same way.
"""

from __future__ import annotations

import json
import re
import shlex
import string
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkdeploy.config.schema import problems_from_validation
from sparkdeploy.config.userfile import JsonSyntaxError, parse_json
from sparkdeploy.errors import ConfigError, Invalid, Problem, escape_controls
from sparkdeploy.images.definitions import definition_names, load_definition
from sparkdeploy.images.vllm_cli import PLUGIN_FLAGS, check_args, describe, image_spec
from sparkdeploy.paths import confined

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
WHOLE_FIELDS = ("max_model_len", "max_num_batched_tokens", "max_num_seqs")  # vLLM reads 1k / 1K suffixes there
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
# Flags whose value is a file the engine reads. A relative path is a file in eugr's container workspace, where
# only its mods put files (mods/<name>/run.sh copies or downloads them there): no sparkdeploy image has it.
FILE_FLAGS = ("--chat-template", "--reasoning-parser-plugin", "--tool-parser-plugin")
PARSER_FLAGS = PLUGIN_FLAGS  # a parser flag and the plugin flag that can register more parser names
# Keys that newer eugr recipes (and their forks) write, which this v1 reader does not know: what does the job here.
UNKNOWN_KEY_USE = {
    "benchmark": "sparkdeploy measures a recipe with `sparkdeploy bench sweep --recipe FILE`",
    "pull_image": "sparkdeploy moves images itself (`sparkdeploy images push` or `images pull`)",
}
MAX_JSON_DEPTH = 32  # a nested config deeper than this is refused (the recipe loader's YAML depth cap)
MAX_DESCRIPTION = 500  # recipes.Recipe's description bound


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
            raise Invalid(
                f"eugr recipe version {v!r} is not one this sparkdeploy reads ({', '.join(SUPPORTED_VERSIONS)})",
                "use a v1 recipe, or update sparkdeploy",
            )
        return v


EUGR_FIELDS = frozenset(EugrRecipe.model_fields)


@dataclass
class Imported:
    """A sparkdeploy recipe (its data, before validation) made from an eugr recipe, and what did not carry."""

    data: dict[str, Any]
    source: Path
    eugr_name: str
    not_carried: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)  # the `vllm serve` argv after substitution
    fmt: str = "eugr"  # or "sparkrun" (sparkrun.py): its argv is the whole command


def is_eugr(data: Any) -> bool:
    return isinstance(data, dict) and MARKER in data


def parse(data: dict[str, Any], source: str) -> EugrRecipe:
    try:
        return EugrRecipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, source, EugrRecipe)) from None


def _fields(raw: dict[str, Any], source: str) -> tuple[EugrRecipe | None, list[Problem]]:
    """eugr's schema, every problem at once: each unknown key with the fix to remove it (or what does its job
    here), then the known fields' problems. None when the known fields do not make a recipe."""
    problems = []
    for key in raw:
        if str(key) in EUGR_FIELDS:
            continue
        use = UNKNOWN_KEY_USE.get(str(key))
        problems.append(
            Problem(
                source,
                str(key),
                "unknown key: eugr's v1 format has no such field, and one this reader does not know may change "
                "what runs",
                f"remove it from the file, or run without it: --set {key}=null" + (f" ({use})" if use else ""),
            )
        )
    try:
        return EugrRecipe.model_validate({k: v for k, v in raw.items() if str(k) in EUGR_FIELDS}), problems
    except ValidationError as exc:
        return None, problems + problems_from_validation(exc, source, EugrRecipe)


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


# -- the argv, read as vLLM's FlexibleArgumentParser reads it (vllm/utils/argparse_utils.py, 0.32.0) -------------


@dataclass
class Arg:
    """One option of the `vllm serve` argv: as written, and in the image's spelling."""

    written: str  # the option as the command writes it (messages quote this)
    flag: str  # the option string vLLM matches: underscores made dashes; a dotted option's base
    value: str | None
    dest: str  # argparse dest in the image's vLLM ('' when it has no such option)
    keys: tuple[str, ...] = ()  # --flag.a.b VALUE: ("a", "b")
    append: bool = False  # --flag.a+ A,B: a list

    def words(self) -> list[str]:
        """The option as argv words in the image's spelling (dotted ones are merged by the caller)."""
        if self.value is None:
            return [self.flag]
        return [f"{self.flag}={self.value}"] if self.value.startswith("-") else [self.flag, self.value]


def canonical(option: str) -> str:
    """vLLM's spelling of a `--` option: underscores before the first '.' become dashes (`--max_model_len` is
    `--max-model-len`, `--compilation_config.pass_config.x` is `--compilation-config.pass_config.x`)."""
    if not option.startswith("--"):
        return option
    head, dot, rest = option[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def read_args(argv: list[str], flags: dict[str, dict[str, Any]]) -> tuple[list[str], list[Arg]]:
    """argv -> (positionals, options). A flag this vLLM does not know keeps the next word as its value unless that
    word is a flag (it is refused by name afterwards)."""
    positionals: list[str] = []
    out: list[Arg] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            i += 1
            continue
        if token.startswith("-O") and token != "-O":  # -O3, -O=3: the optimization level
            level = token[3:] if token[2:3] == "=" else token[2:]
            out.append(Arg(token, "--optimization-level", level, _dest(flags, "--optimization-level")))
            i += 1
            continue
        if token == "-O" and nxt in ("0", "1", "2", "3"):
            out.append(Arg(token, "--optimization-level", nxt, _dest(flags, "--optimization-level")))
            i += 2
            continue
        key, eq, inline = token.partition("=")
        key = canonical(key)
        base, dot, sub = key.partition(".")
        if dot:  # --x.y.z VALUE (vLLM always takes the next word as its value)
            append = sub.endswith("+")
            keys = tuple(sub.removesuffix("+").split("."))
            out.append(Arg(token, base, inline if eq else nxt, _dest(flags, base), keys, append))
            i += 1 if eq else 2
            continue
        info = flags.get(key)
        takes = info.get("takes_value", True) if info else not (nxt is None or nxt.startswith("-"))
        if eq:
            out.append(Arg(token, key, inline, _dest(flags, key)))
            i += 1
        elif takes and nxt is not None:
            out.append(Arg(token, key, nxt, _dest(flags, key)))
            i += 2
        else:
            out.append(Arg(token, key, None, _dest(flags, key)))
            i += 1
    return positionals, out


def _dest(flags: dict[str, dict[str, Any]], flag: str) -> str:
    info = flags.get(flag)
    return str(info["dest"]) if info else ""


def typed(text: str) -> Any:
    """A dotted option's value as vLLM types it: JSON (true, 2, 0.5, [..], {..}), else a human-readable whole
    number (80g, 1K), else the string itself."""
    try:
        return parse_json(text, "", "")  # the one JSON door (no NaN, no duplicate keys, depth capped)
    except ConfigError:
        pass
    try:
        return human_readable_int(text)
    except ValueError:
        return text


def human_readable_int(text: str) -> int:
    """vLLM's `1k` (10^3) and `1K` (2^10) suffixes (utils/argparse_utils.py human_readable_int)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if not m:
        raise ValueError(text)
    number, suffix = m.groups()
    if suffix.islower():
        return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
    if "." in number:
        raise ValueError(text)
    return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]


def _merge(original: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's recursive_dict_update: mappings merge, lists concatenate, anything else is replaced."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            _merge(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] = original[k] + v
        else:
            original[k] = v


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _json_object(arg: Arg, source: str, problems: list[Problem]) -> dict[str, Any] | None:
    """An option's JSON object value (`--compilation-config '{...}'`), or None with the problem recorded."""
    try:  # the one JSON door: duplicate keys, NaN and deep nesting refused as in every file we read
        loaded = parse_json(arg.value or "", source, "command", f"write {arg.written}'s value as plain JSON")
    except JsonSyntaxError:
        loaded = None
    except ConfigError as exc:  # JSON, but refused (too deep, a duplicate key, NaN): that reason, one line
        problems += exc.problems
        return None
    if not isinstance(loaded, dict) or _depth(loaded) > MAX_JSON_DEPTH:
        problems.append(
            Problem(
                source,
                "command",
                f"{arg.written}: its value is not a JSON object (of at most {MAX_JSON_DEPTH} levels)",
                f'write it as JSON, e.g. {arg.flag} \'{{"cudagraph_mode": "PIECEWISE"}}\', or as {arg.flag}.KEY VALUE',
            )
        )
        return None
    return loaded


def _whole(arg: Arg, field_name: str, source: str, problems: list[Problem]) -> int | None:
    """TP or PP from the command: a positive whole number, else the problem names the option."""
    text = (arg.value or "").strip()
    if re.fullmatch(r"[0-9]{1,6}", text) and int(text) >= 1:
        return int(text)
    shown = "no value" if arg.value is None else repr(arg.value)
    problems.append(
        Problem(
            source,
            "command",
            f"{arg.written} {shown}: not a positive whole number (0, negatives, fractions, NaN and words are refused)",
            f"write {arg.written} 2 (1 or more), or pass --set {field_name}=2 when the command takes it from "
            f"{{{field_name}}}",
        )
    )
    return None


def _flag_spec(image: str) -> dict[str, Any]:
    return image_spec(load_definition(image))


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
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


def _build_args(args: list[str]) -> list[tuple[str, str | None]]:
    """eugr's build_args as (flag, its value): `-f Dockerfile.x` is one build arg, not two."""
    out: list[tuple[str, str | None]] = []
    for word in args:
        if out and not word.startswith("-") and out[-1][1] is None:
            out[-1] = (out[-1][0], word)
        else:
            out.append((word, None))
    return out


def _image(recipe: EugrRecipe, source: str) -> tuple[str | None, list[str], list[Problem]]:
    """The sparkdeploy image for the recipe's container and build_args, notes, and one problem for each that has
    no equivalent (the image is None when the container has none)."""
    notes: list[str] = []
    problems: list[Problem] = []
    # eugr's own tags map to ours; a sparkdeploy image definition's name (--set container=vllm-node) is taken as is.
    image = CONTAINERS.get(recipe.container) or (recipe.container if recipe.container in definition_names() else None)
    for arg, value in _build_args(recipe.build_args):
        shown = arg if value is None else f"{arg} {value}"
        if arg not in BUILD_ARGS:
            problems.append(
                Problem(
                    source,
                    "build_args",
                    f"{shown} has no sparkdeploy equivalent (it changes how eugr builds {recipe.container})",
                    "pick the sparkdeploy image that carries what it adds with --set container=IMAGE and drop it "
                    "with --set build_args=[]",
                )
            )
            continue
        wanted = BUILD_ARGS[arg]
        if wanted:
            notes.append(f"build_args {shown}: sparkdeploy image {wanted}")
            image = wanted
        else:
            notes.append(f"build_args {shown}: how eugr builds its image; nothing changes at run time")
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
    return image, notes, problems


def split_sets(
    raw: dict[str, Any], set_values: list[tuple[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, Any]], list[str]]:
    """--set values for an eugr recipe: an eugr field (container, mods, ...) replaces it in the eugr data, a
    top-level key of the file set to null is removed (an unknown key included: `--set pull_image=null`), a
    placeholder name (or a defaults key) is a parameter, anything else (vllm.x, tensor_parallel) applies to the
    sparkdeploy recipe made from it, as for any recipe. Also returns the mods the --set values dropped."""
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
        elif value is None and key in data and key not in ("recipe_version", "name", "command"):
            data.pop(key)
        elif key in EUGR_FIELDS:
            data[key] = value
        else:
            rest.append((key, value))
    before, after = raw.get("mods"), data.get("mods")
    dropped = [str(m) for m in before or [] if m not in (after or [])] if isinstance(before, list) else []
    return data, params, rest, dropped


def _mods_text(mods: list[str]) -> str:
    return ", ".join(mods) if len(mods) <= 1 else "one of " + ", ".join(mods)


def _relative_file(value: str | None) -> bool:
    """A file name relative to the container's working folder (not an absolute path, URL or inline template)."""
    if not value or value.startswith(("/", "~")) or "://" in value:
        return False
    return not any(c in value for c in "{}\n ")


def _mod_args(
    args: list[Arg], gone: list[str], spec: dict[str, Any], image: str, source: str, problems: list[Problem]
) -> set[int]:
    """What in the argv only a mod (gone: refused or dropped) or eugr's container workspace provides: a file, a
    parser this vLLM lacks, an option it lacks. One problem each; returns the indexes reported."""
    reported: set[int] = set()
    where = _mods_text(gone) if gone else ""
    values = spec.get("value_sets", {})
    plugins = {a.flag: a for a in args if a.flag in PARSER_FLAGS.values()}
    desc = f"image {image} ({describe(load_definition(image))})"
    for i, a in enumerate(args):
        if a.flag in FILE_FLAGS and _relative_file(a.value):
            who = f"{where} puts it there" if gone else "no sparkdeploy image carries it"
            problems.append(
                Problem(
                    source,
                    "command",
                    f"{a.written} {a.value}: a file in eugr's container workspace; {who}, and sparkdeploy runs no "
                    "mods, so the engine would not find it",
                    f"remove {a.written} from the command (and what needs it), or bake the file into an image "
                    "definition (images/<name>/) and give its absolute path",
                )
            )
            reported.add(i)
        elif a.flag in PARSER_FLAGS and a.value is not None and a.flag in values and a.value not in values[a.flag]:
            plugin = plugins.get(PARSER_FLAGS[a.flag])
            if plugin is not None:
                why = f"only the plugin file of {plugin.written} {plugin.value} registers it"
            elif gone:
                why = f"only {where} can have added it"
            else:
                why = "it registers no parser of that name"
            close = get_close_matches(a.value, [str(v) for v in values[a.flag]], n=3, cutoff=0.5)
            problems.append(
                Problem(
                    source,
                    "command",
                    f"{a.written} {a.value}: not a parser of {desc} ({why})",
                    "use one of its parsers"
                    + (f" (close: {', '.join(close)})" if close else "")
                    + f", or remove {a.written}",
                )
            )
            reported.add(i)
        elif not a.dest and gone:
            problems.append(
                Problem(
                    source,
                    "command",
                    f"{a.written} is not a flag of {desc}: only {where} "
                    "can have added it, and sparkdeploy runs no mods",
                    f"remove {a.written} from the command, or use an image whose vLLM has it",
                )
            )
            reported.add(i)
    return reported


def _solo_params(recipe: EugrRecipe, params: dict[str, Any] | None, notes: list[str]) -> dict[str, Any]:
    """The placeholders' values: a solo_only recipe serves TP 1 unless --set asks (eugr's run-recipe.py: TP 1 in
    solo mode unless --tp)."""
    params = dict(params or {})
    if recipe.solo_only and "tensor_parallel" not in params:
        if recipe.defaults.get("tensor_parallel") not in (None, 1):
            notes.append(
                f"tensor_parallel {recipe.defaults['tensor_parallel']}: solo_only, so 1 (as eugr's run-recipe does "
                "in solo mode); --set tensor_parallel=N to ask for more"
            )
        params["tensor_parallel"] = 1
    return params


@dataclass
class _Command:
    """What the `vllm serve` options say, sorted: recipe fields, parallelism, the backend, and the options carried
    as extra_args (JSON-valued ones in `objects`, written with the option string in `spelling`)."""

    model: str | None
    data: dict[str, Any] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    tp: int = 1
    pp: int = 1
    backend: str | None = None
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # dest -> the JSON object of --x '{...}'
    dotted: dict[str, dict[str, Any]] = field(default_factory=dict)  # dest -> the object of --x.y V options
    spelling: dict[str, str] = field(default_factory=dict)  # dest -> the option string it is written with


def _field_value(a: Arg, source: str, problems: list[Problem]) -> tuple[bool, Any]:
    """A recipe field's value from its option (False first: the option is refused, its problem added)."""
    taken: Any = True if a.value is None else _number(a.value)
    if a.dest in WHOLE_FIELDS and isinstance(taken, str):
        try:
            taken = human_readable_int(taken)  # 32k, as vLLM reads these
        except ValueError:
            pass
    if a.dest == "served_model_name":
        taken = (a.value or "").split()[0] if (a.value or "").strip() else None
        if taken is None:
            problems.append(Problem(source, "command", f"{a.written}: an empty served name", "give a name or drop it"))
            return False, None
    return True, taken


def _take(cmd: _Command, a: Arg, source: str, problems: list[Problem], notes: list[str]) -> None:
    """One option of the command, sorted into `cmd`: a field, parallelism, set by sparkdeploy, or carried."""
    if a.keys:
        value: Any = (a.value or "").split(",") if a.append else typed(a.value or "")
        for key in reversed(a.keys):
            value = {key: value}
        _merge(cmd.dotted.setdefault(a.dest or a.flag, {}), value)
        cmd.spelling.setdefault(a.dest or a.flag, a.flag)
    elif a.dest == "model":
        cmd.model = a.value
    elif a.dest == "max_model_len" and (a.value or "").strip().lower() in ("auto", "-1"):
        notes.append(f"{a.written} {a.value}: vLLM's default, the model's own context length")
    elif a.dest in FIELDS:
        good, taken = _field_value(a, source, problems)
        if good:
            _set(cmd.data, FIELDS[a.dest], taken)
    elif a.dest == "tensor_parallel_size":
        cmd.tp = _whole(a, "tensor_parallel", source, problems) or cmd.tp
    elif a.dest == "pipeline_parallel_size":
        cmd.pp = _whole(a, "pipeline_parallel", source, problems) or cmd.pp
    elif a.dest in SET_BY_SPARKDEPLOY:
        if a.dest == "distributed_executor_backend":
            cmd.backend = a.value
        notes.append(f"{a.written} {a.value}: {SET_BY_SPARKDEPLOY[a.dest]}")
    elif a.dest == "compilation_config" and a.value is not None:
        loaded = _json_object(a, source, problems)
        if loaded is not None:
            cmd.objects[a.dest] = loaded  # a repeated option: the last wins, as in argparse
            cmd.spelling[a.dest] = a.flag
    else:
        cmd.extra += a.words()


def _json_options(cmd: _Command, notes: list[str]) -> dict[str, Any] | None:
    """The JSON-valued options: --speculative-config.x V and the like become one JSON value each in extra_args,
    in vLLM's spelling; the compilation config is returned (a recipe field of its own)."""
    for dest, value in cmd.dotted.items():
        if dest in cmd.objects:  # vLLM appends the dotted keys' JSON after the argv: it replaces the written JSON
            notes.append(
                f"{cmd.spelling[dest]}: its JSON is replaced by the {cmd.spelling[dest]}.KEY options, as vLLM reads "
                "them (it passes those last)"
            )
        cmd.objects[dest] = value
    comp = cmd.objects.pop("compilation_config", None)
    for dest, value in cmd.objects.items():
        cmd.extra += [cmd.spelling[dest], json.dumps(value, separators=(",", ":"))]
    return comp


def _read_command(
    recipe: EugrRecipe,
    positionals: list[str],
    args: list[Arg],
    reported: Collection[int],
    source: str,
    problems: list[Problem],
    notes: list[str],
) -> _Command:
    """The serve command's options (those not reported already) as recipe data: the model, fields, parallelism."""
    cmd = _Command(model=positionals[0] if positionals else None)
    for i, a in enumerate(args):
        if i not in reported:
            _take(cmd, a, source, problems, notes)
    comp = _json_options(cmd, notes)
    if len(positionals) > 1:
        problems.append(Problem(source, "command", f"more than one model: {' '.join(positionals)}", "name one model"))
    cmd.model = cmd.model or recipe.model
    if not cmd.model:
        problems.append(Problem(source, "command", "names no model", "write `vllm serve ORG/MODEL ...`"))
    elif recipe.model and recipe.model != cmd.model:
        notes.append(f"model {recipe.model} (for eugr's --setup download): the command serves {cmd.model}")
    if comp:
        mode = comp.pop("cudagraph_mode", None)
        cmd.data.setdefault("vllm", {})["compilation"] = {
            **({"cudagraph_mode": str(mode).upper()} if mode is not None else {}),
            **({"extra": comp} if comp else {}),
        }
    if cmd.extra:
        cmd.data.setdefault("vllm", {})["extra_args"] = cmd.extra
    return cmd


def _topologies(recipe: EugrRecipe, tp: int, pp: int, source: str, problems: list[Problem]) -> tuple[list[str], str]:
    """The topologies the recipe serves on, and its default: from solo_only / cluster_only and TP x PP."""
    if recipe.solo_only and tp * pp > 1:
        problems.append(
            Problem(
                source,
                "solo_only",
                f"solo_only, but the command asks for TP={tp} x PP={pp} (one Spark has one GPU)",
                "set tensor_parallel to 1, or drop solo_only",
            )
        )
    if recipe.solo_only:
        return ["solo", "2xsolo"], "solo"
    if recipe.cluster_only:
        return ["cluster"], "cluster"
    return ["solo", "cluster", "2xsolo"], ("cluster" if tp * pp > 1 else "solo")


def _description(recipe: EugrRecipe, notes: list[str]) -> str:
    """The description on one line, cut to the recipe schema's bound (and said so)."""
    description = " ".join((recipe.description or recipe.name).split())
    if len(description) > MAX_DESCRIPTION:
        notes.append(
            f"description: {len(description)} characters on one line, cut to the recipe's {MAX_DESCRIPTION} "
            f"(it ends at ...{description[MAX_DESCRIPTION - 30 : MAX_DESCRIPTION]})"
        )
        description = description[:MAX_DESCRIPTION]
    return description


def _recipe_name(path: Path, notes: list[str]) -> str:
    name = _plain(path.stem)
    if name != path.stem:
        notes.append(f"name: the file name {path.stem!r} made a recipe name: {name}")
    return name


def _parallel_fields(cmd: _Command, notes: list[str]) -> dict[str, Any]:
    """cluster_backend and tensor_parallel as the recipe writes them (pipeline parallelism: the cluster's stages)."""
    out: dict[str, Any] = {}
    if cmd.backend in ("ray",):
        out["cluster_backend"] = "ray"
    elif cmd.backend in ("mp", "external_launcher"):
        out["cluster_backend"] = "native"
    if cmd.tp > 1 or cmd.pp > 1:
        out["tensor_parallel"] = cmd.tp
    if cmd.pp > 1:
        notes.append(
            f"pipeline_parallel {cmd.pp}: cluster splits the inventory's nodes into stages of {cmd.tp} "
            f"(PP = nodes / {cmd.tp}; eugr's recipe was written for {cmd.tp * cmd.pp} nodes)"
        )
    return out


def to_recipe_data(
    raw: dict[str, Any],
    path: Path,
    params: dict[str, Any] | None = None,
    dropped_mods: list[str] | tuple[str, ...] = (),
    check: Callable[[dict[str, Any]], list[Problem]] | None = None,
    replaced: Collection[str] = (),
) -> Imported:
    """The sparkdeploy recipe data for an eugr recipe file (validated later, as any recipe's), or ConfigError with
    every problem found (`check`: the recipe schema's problems of the data made, added when others are found;
    `replaced`: recipe fields --set gives, e.g. vllm.load_format: the command's value for them is not checked)."""
    source = str(path)
    recipe, problems = _fields(raw, source)
    if recipe is None:
        raise ConfigError(problems)
    notes: list[str] = []
    params = _solo_params(recipe, params, notes)
    image, image_notes, image_problems = _image(recipe, source)
    notes += image_notes
    argv: list[str] = []
    try:
        argv = serve_argv(substitute(recipe, params, source), source)
    except ConfigError as exc:
        raise ConfigError(problems + exc.problems + image_problems) from None
    problems += image_problems
    checked = image or "vllm-node"  # the argv is still read and checked when the container has no equivalent
    spec = _flag_spec(checked)
    positionals, args = read_args(argv, dict(spec["flags"]))
    gone = [m for m in recipe.mods if m not in MODS] + [m for m in dropped_mods if m not in recipe.mods]
    reported = _mod_args(args, gone, spec, checked, source, problems)
    cmd = _read_command(recipe, positionals, args, reported, source, problems, notes)
    topologies, default = _topologies(recipe, cmd.tp, cmd.pp, source, problems)
    # The argv as the image's vLLM would get it, every flag and value checked against its CLI (what `up` checks).
    plain = [
        w
        for i, a in enumerate(args)
        if i not in reported and not a.keys and FIELDS.get(a.dest) not in replaced
        for w in a.words()
    ]
    try:
        check_args([cmd.model or "MODEL", *plain], load_definition(checked), source)
    except ConfigError as exc:
        problems += exc.problems
    description = _description(recipe, notes)
    out: dict[str, Any] = {
        "name": _recipe_name(path, notes),
        "description": description,
        "model": cmd.model,
        "image": image or checked,
        "topologies": topologies,
        "default_topology": default,
        "fits_one_node": not recipe.cluster_only,
    }
    if "served_model_name" in cmd.data:
        out["served_model_name"] = cmd.data.pop("served_model_name")
    out.update(_parallel_fields(cmd, notes))
    out.update(cmd.data)
    if recipe.env:
        out["env"] = {k: _text(v) for k, v in recipe.env.items()}
    if problems:
        if check is not None:
            problems += [p for p in check(out) if p not in problems]
        raise ConfigError(problems)
    return Imported(data=out, source=path, eugr_name=recipe.name, not_carried=notes, argv=argv)


def _plain(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "eugr-recipe"
    return name[:128]


# -- `sparkdeploy recipes import` ---------------------------------------------------------------------------


HEADER_WIDTH = 116  # the serve line is wrapped at this width, never cut


def _wrapped(words: list[str], width: int = HEADER_WIDTH) -> list[str]:
    """Shell words as comment lines of the header, continued with backslashes: every word kept."""
    lines: list[str] = []
    line = "#  "
    for word in words:
        if len(line) + 1 + len(word) + 2 > width and line.strip("# "):
            lines.append(line + " \\")
            line = "#     "
        line += " " + word
    return lines + [line]


def comment(text: str) -> str:
    """One YAML comment line: every line break and other control character in `text` escaped (\\n), so a value
    from the community recipe (a default, the file name, a flag's value) can never end the comment and start a
    line of live YAML."""
    return f"# {escape_controls(text)}"


def header(imported: Imported) -> str:
    if imported.fmt == "sparkrun":
        lines = [
            comment(f"Imported by `sparkdeploy recipes import` from the sparkrun recipe {imported.source.name}"),
            comment("(spark-arena/sparkrun v2 format). Its command after substitution:"),
            *_wrapped([escape_controls(shlex.quote(a)) for a in imported.argv]),
        ]
        if imported.not_carried:
            lines.append(comment("Not carried over as written:"))
            lines += [comment(f"  - {note}") for note in imported.not_carried]
        return "\n".join(lines) + "\n"
    lines = [
        comment(f"Imported by `sparkdeploy recipes import` from the eugr v1 recipe {imported.source.name}"),
        comment(
            f"({imported.eugr_name!r}, eugr/spark-vllm-docker format). Its `vllm serve` command after substitution:"
        ),
        *_wrapped(["vllm", "serve", *(escape_controls(shlex.quote(a)) for a in imported.argv)]),
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
