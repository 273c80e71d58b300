"""The CLI of the vLLM an image carries, and the check of a `vllm serve` line against it.

The accepted flags are the image's own: `images/<image>/vllm-args-<version>.json`, dumped from the argument
parser of exactly the vLLM sources the image pins (scripts/dump_vllm_args.py; for a fork, docs/images.md
says how), plus any `extra_flags` a simulated image declares; a registry image's are read from the image
itself (images/registry_pull.py). So a recipe that uses `--mxfp4-layers` with an image whose vLLM lacks it is
rejected before anything runs, naming the image and its vLLM version. eugr.py reads eugr recipes' argv
with the same flag lists, so this module knows nothing of recipes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sparkdeploy import paths
from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition, definition_names, load_definition
from sparkdeploy.images.image_ref import RegistryImage

# Parser flags whose names vLLM checks when the server starts (the dump's value_sets), and the plugin flag that
# can register more names before that.
PLUGIN_FLAGS = {"--reasoning-parser": "--reasoning-parser-plugin", "--tool-call-parser": "--tool-parser-plugin"}


@cache
def _read_spec(path: str) -> dict[str, Any]:
    data = load_json_file(path, "vLLM flag dump", limit=16 << 20)
    if not isinstance(data, dict):
        raise ConfigError(Problem(path, "", "not a JSON object", "dump it again (scripts/ in the image definition)"))
    return data


@cache
def flag_spec(version: str) -> dict[str, Any]:
    """The dump for a vLLM version, wherever an image definition carries it (images/*/vllm-args-V.json)."""
    matches = sorted(paths.images_dir().glob(f"*/vllm-args-{version}.json"))
    if not matches:
        raise ConfigError(
            Problem(
                "images/",
                f"vllm-args-{version}.json",
                f"no argument list for vLLM {version}",
                "dump it with scripts/dump_vllm_args.py",
            )
        )
    return _read_spec(str(matches[0]))


def image_spec(image: ImageDefinition) -> dict[str, Any]:
    """The CLI of the vLLM this image really carries: its own dump (images/<name>/vllm-args-<version>.json,
    made from exactly the sources it pins), else the dump of the same release another definition carries
    (vllm-sim stands in for vllm-node with vLLM 0.32.0's)."""
    if isinstance(image, RegistryImage):  # read from the image itself, kept by digest (images/registry_pull.py)
        return image.cli or {"flags": {}, "unread": True}
    version = image.vllm_version
    if not version:
        raise ConfigError(
            Problem(
                f"images/{image.name}/manifest.yaml",
                "vllm_version",
                "missing",
                "pin the vLLM version the image carries",
            )
        )
    own = image.directory / f"vllm-args-{version}.json" if image.directory else None
    if own is not None and own.is_file():
        return _read_spec(str(own))
    return flag_spec(version)


def describe(image: ImageDefinition) -> str:
    """`vLLM 0.32.0` or, for a fork, `vLLM 0.1.dev12777 (christopherowen/vllm@045293d8)`: said in every message."""
    if isinstance(image, RegistryImage):
        return f"vLLM {image.vllm_version or '(version unknown)'}, read from the image {image.digest or ''}".rstrip()
    ref = image_spec(image).get("source_ref")
    return f"vLLM {image.vllm_version}" + (f" ({ref})" if ref else "")


def check_args(args: list[str], image: ImageDefinition, recipe_file: str) -> None:
    """Every flag must exist in the image's vLLM or be declared by the image; choices must be valid."""
    whole = image_spec(image)
    if whole.get("unread"):
        return  # a registry image not pulled yet: build_deployment says so; `up` checks again after its pull
    spec = whole["flags"]
    unproven = set(whole.get("unverified_flags", []))
    extra = set(image.extra_flags)
    # a plugin file may register parser names the image's vLLM lacks: their names are not checked then
    plugged = {f for f, plugin in PLUGIN_FLAGS.items() if any(a.split("=", 1)[0] == plugin for a in args)}
    problems = []
    i = 1  # args[0] is the model
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            i += 1
            continue
        flag, eq, inline = token.partition("=")
        if flag in extra:
            i += 1 if eq else 2
            continue
        info = spec.get(flag)
        if info is None:
            owner = [d for d in _images_accepting(flag) if d != image.name]
            if flag in unproven:
                msg = (
                    f"{flag} may or may not be a flag of image {image.name} ({describe(image)}): its dump "
                    f"could not prove it"
                )
                fix = "drop it, or build the image and refresh its flag dump (docs/images.md)"
            elif owner:
                msg = f"{flag} is not a flag of image {image.name} ({describe(image)})"
                fix = f"use an image whose vLLM has it ({', '.join(owner)}), or drop it"
            else:
                msg = f"{flag} is not a flag of image {image.name} ({describe(image)})"
                fix = "check the flag name against `vllm serve --help` of that vLLM"
            problems.append(Problem(recipe_file, "vllm", msg, fix))
            i += 1
            continue
        takes_value = info.get("takes_value", True)
        value = inline if eq else (args[i + 1] if takes_value and i + 1 < len(args) else None)
        # Some values are checked by vLLM after argparse (load formats, quantizations, executor backends):
        # the dump records those sets too.
        choices = info.get("choices") or (None if flag in plugged else whole.get("value_sets", {}).get(flag))
        if takes_value and choices and value is not None and value not in [str(c) for c in choices]:
            problems.append(
                Problem(
                    recipe_file,
                    "vllm",
                    f"{flag} {value!r} is not one of the choices of image {image.name} ({describe(image)})",
                    f"use one of {', '.join(map(str, choices))}",
                )
            )
        i += 1 if (eq or not takes_value) else 2
    if problems:
        raise ConfigError(problems)


def check_env(env: dict[str, str], image: ImageDefinition) -> list[str]:
    """Warnings for VLLM_* variables the pinned vLLM does not know (they are silently ignored)."""
    if not image.vllm_version:
        return []
    spec = image_spec(image)
    if "environment_variables" not in spec:
        return []  # a registry image's help lists no environment variables: nothing to check against
    known = set(spec["environment_variables"])
    return [
        f"env {name} is not an environment variable of {describe(image)}: it has no effect unless "
        f"the image's own patches read it"
        for name in sorted(env)
        if name.startswith("VLLM_") and name not in known
    ]


def _images_accepting(flag: str) -> list[str]:
    """Definitions whose vLLM has `flag`: in their own dump or as a declared extra flag (simulated images
    included, since they stand in for those)."""
    out = []
    for name in definition_names():
        d = load_definition(name)
        if flag in d.extra_flags:
            out.append(name)
        elif d.vllm_version and d.directory and (d.directory / f"vllm-args-{d.vllm_version}.json").is_file():
            if flag in image_spec(d)["flags"]:
                out.append(name)
    return out
