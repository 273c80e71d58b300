"""The Jinja environment every template renders through.

Safety rules, enforced here so no template can forget them:
- StrictUndefined: an undefined variable fails the render, naming the template, line and variable;
- shell values go through `q` (one word), `shjoin` (an argv list) or `qpath` (a path that may start with ~/):
  a value holding spaces, quotes, `$(...)`, backticks, `;`, a newline or a leading `-` stays inert data;
- YAML and JSON come from serializers (`to_yaml`, `to_json`), never from text templates;
- env-file lines go through `envline`, which refuses values that would change the file's meaning.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from functools import cache
from typing import Any

import jinja2
import yaml

from sparkdeploy import paths
from sparkdeploy.errors import ConfigError, Problem

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shell_quote(value: Any) -> str:
    if value is None or isinstance(value, jinja2.Undefined):
        raise ValueError("refusing to quote an empty value (None) into a shell command")
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


def shell_join(values: Iterable[Any]) -> str:
    if isinstance(values, (str, bytes)):
        raise ValueError("shjoin takes a list of arguments, not a string")
    return " ".join(shell_quote(v) for v in values)


def shell_path(value: str) -> str:
    """A path for a shell word: `~/x` becomes "$HOME"/'x' so the home directory expands and nothing else does."""
    text = str(value)
    if text == "~":
        return '"$HOME"'
    if text.startswith("~/"):
        return '"$HOME"/' + shlex.quote(text[2:])
    return shlex.quote(text)


def env_line(value: Any, name: str) -> str:
    """`NAME=value` for a Docker --env-file: taken literally up to the end of the line, so no newline."""
    if not ENV_NAME.fullmatch(str(name)):
        raise ValueError(f"{name!r} is not an environment variable name")
    text = "" if value is None else str(value)
    if "\n" in text or "\r" in text or "\0" in text:
        raise ValueError(f"the value of {name} holds a newline, which an env file cannot carry")
    return f"{name}={text}"


def to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, width=1000)


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


@cache
def environment(templates: str | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates or str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        q=shell_quote, shjoin=shell_join, qpath=shell_path, to_yaml=to_yaml, to_json=to_json, envline=env_line
    )
    return env


def _template_line(exc: BaseException, name: str) -> int | None:
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(name):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render(template: str, /, **context: Any) -> str:
    """Render templates/<template>; any failure is a ConfigError naming the template (and line when known)."""
    env = environment()
    name = template
    try:
        return env.get_template(template).render(**context)
    except jinja2.UndefinedError as exc:
        line = _template_line(exc, name)
        where = f"templates/{name}" + (f":{line}" if line else "")
        raise ConfigError(
            Problem(
                where, "", f"undefined variable: {exc.message}", "pass the variable to the template or fix its name"
            )
        ) from None
    except jinja2.TemplateError as exc:
        raise ConfigError(Problem(f"templates/{name}", "", f"template error: {exc}", "fix the template")) from None
    except ValueError as exc:
        line = _template_line(exc, name)
        where = f"templates/{name}" + (f":{line}" if line else "")
        raise ConfigError(Problem(where, "", str(exc), "fix the value in the recipe or inventory")) from None
