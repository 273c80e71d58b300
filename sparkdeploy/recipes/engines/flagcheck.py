"""Checking a command line against an engine's flag dump (images/engine-args/): the parser's own rules, emulated.

SGLang's is Python's argparse with allow_abbrev (a unique prefix of a long option is that option, `--tp` is
`--tp-size`; an ambiguous one fails, as argparse fails it); llama.cpp's is its own (common/arg.cpp): exact names
only, `_` read as `-` in long names, no `--flag=value` form. Each problem is one line naming the engine and its
version.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError, Problem


@cache
def read_dump(path: str) -> dict[str, Any]:
    data = load_json_file(path, "engine flag dump", limit=16 << 20)
    if not isinstance(data, dict) or not isinstance(data.get("flags"), dict):
        raise ConfigError(Problem(path, "flags", "not a flag dump", "dump it again (scripts/dump_*_args.py)"))
    return data


def _number(kind: str | None, value: str) -> bool:
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
    except ValueError:
        return False
    return True


def argparse_match(token: str, flags: dict[str, Any], allow_abbrev: bool) -> tuple[str | None, list[str]]:
    """(the option argparse takes `token` for, the candidates when it is ambiguous)."""
    if token in flags:
        return token, []
    if not (allow_abbrev and token.startswith("--")):
        return None, []
    found = sorted({f for f in flags if f.startswith(token) and f.startswith("--")})
    if len(found) == 1:
        return found[0], []
    return None, found


def check_argparse(args: list[str], dump_path: Path, what: str, recipe_file: str, field: str) -> None:
    """`args` (options only) parse with the dumped argparse parser: known (or a unique prefix), values given,
    choices and numbers right."""
    dump = read_dump(str(dump_path))
    flags: dict[str, Any] = dump["flags"]
    value_sets: dict[str, Any] = dump.get("value_sets", {})
    problems: list[Problem] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-"):
            problems.append(Problem(recipe_file, field, f"{token!r} is not an option of {what}", "drop it"))
            continue
        name, eq, inline = token.partition("=")
        flag, ambiguous = argparse_match(name, flags, bool(dump.get("allow_abbrev", True)))
        if flag is None:
            if ambiguous:
                msg = f"{name} is ambiguous for {what}: it could be {', '.join(ambiguous[:6])}"
                fix = "write the whole option name"
            else:
                msg = f"{name} is not a flag of {what}"
                fix = f"check it against `--help` of {what} (images/engine-args/{dump_path.name})"
            problems.append(Problem(recipe_file, field, msg, fix))
            continue
        info = flags[flag]
        nargs = info.get("nargs")
        if not info.get("takes_value"):
            if eq:
                problems.append(Problem(recipe_file, field, f"{flag} of {what} takes no value", f"write {flag}"))
            continue
        values: list[str] = []
        if eq:
            values = [inline]
        elif nargs in (None, 1) or isinstance(nargs, int):
            count = 1 if nargs is None else int(nargs)
            values = args[i : i + count]
            i += len(values)
            if len(values) < count or any(v.startswith("--") for v in values):
                problems.append(Problem(recipe_file, field, f"{flag} of {what} needs a value", f"{flag} VALUE"))
                continue
        else:  # '?', '*', '+': values up to the next option
            while i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            if nargs == "+" and not values:
                problems.append(Problem(recipe_file, field, f"{flag} of {what} needs a value", f"{flag} VALUE"))
                continue
        choices = info.get("choices")
        vset = value_sets.get(flag)
        for value in values:
            if choices and value not in [str(c) for c in choices]:
                problems.append(
                    Problem(
                        recipe_file,
                        field,
                        f"{flag} {value!r} is not one of the choices of {what}",
                        f"use one of {', '.join(map(str, choices))}",
                    )
                )
            elif vset and value.upper() not in [v.upper() for v in vset["values"]]:
                problems.append(
                    Problem(
                        recipe_file,
                        field,
                        f"{flag} {value!r} is not known to {what}",
                        f"one of {', '.join(vset['values'])}",
                    )
                )
            elif not _number(info.get("type"), value):
                problems.append(
                    Problem(recipe_file, field, f"{flag} of {what} takes a number, not {value!r}", "fix it")
                )
    if problems:
        raise ConfigError(problems)


def check_llamacpp(args: list[str], dump_path: Path, what: str, recipe_file: str, field: str) -> None:
    """`args` parse with llama.cpp's own option reader (common_params_parse_ex)."""
    flags: dict[str, Any] = read_dump(str(dump_path))["flags"]
    problems: list[Problem] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        name = "--" + token[2:].replace("_", "-") if token.startswith("--") else token
        info = flags.get(name)
        if info is None:
            if "=" in token and token.partition("=")[0] in flags:
                msg, fix = f"{token}: {what} has no --flag=value form", f"write {token.partition('=')[0]} VALUE"
            else:
                msg, fix = f"{token} is not a flag of {what}", f"check it against `llama-server --help` ({what})"
            problems.append(Problem(recipe_file, field, msg, fix))
            continue
        count = int(info.get("values") or 0) if info.get("takes_value") else 0
        values = args[i : i + count]
        i += len(values)
        if len(values) < count:
            problems.append(Problem(recipe_file, field, f"{name} of {what} needs a value", f"{name} VALUE"))
            continue
        choices = info.get("choices")
        if choices and values and values[0] not in [str(c) for c in choices]:
            problems.append(
                Problem(
                    recipe_file,
                    field,
                    f"{name} {values[0]!r} is not one of the choices of {what}",
                    f"use one of {', '.join(map(str, choices))}",
                )
            )
    if problems:
        raise ConfigError(problems)
