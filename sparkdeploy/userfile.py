"""Every file and YAML value the user gives is read here, with the same limits and one-line errors.

- a file must exist, be a regular file, be readable, hold UTF-8 and be at most MAX_FILE_BYTES;
- YAML is parsed with SafeLoader, but aliases (`*name`, the way to a "billion laughs" bomb) and duplicate keys
  (YAML keeps the last one silently: a recipe could serve another model than the one read first) are refused,
  nesting stops at MAX_DEPTH (a 5000-deep list would be a RecursionError) and no string exceeds MAX_SCALAR;
- an error never quotes the file's text (a secrets file given by mistake would be echoed): only line and column.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from sparkdeploy.errors import ConfigError, Problem

MAX_FILE_BYTES = 1 << 20  # an inventory or recipe is a few KB
MAX_DEPTH = 32
MAX_SCALAR = 4096
MAX_NODES = 100_000


def read_text(path: Path, what: str = "file", fix: str = "check the path") -> str:
    """The file's text, or a ConfigError naming the path and the fix (missing, folder, unreadable, not UTF-8)."""
    shown = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ConfigError(Problem(shown, "", f"cannot read the {what}: no such file", fix)) from None
    except IsADirectoryError:
        raise ConfigError(Problem(shown, "", f"{what} is a folder, not a file", fix)) from None
    except OSError as exc:
        raise ConfigError(
            Problem(shown, "", f"cannot read the {what}: {exc.strerror}", "make it readable by this user (chmod u+r)")
        ) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(Problem(shown, "", f"{what} is a folder, not a file", fix))
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(Problem(shown, "", f"{what} is not a regular file", fix))
        if st.st_size > MAX_FILE_BYTES:
            raise ConfigError(
                Problem(
                    shown, "", f"{what} is {st.st_size} bytes, more than {MAX_FILE_BYTES}", "is this the right file?"
                )
            )
        try:
            data = os.read(fd, MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(Problem(shown, "", f"cannot read the {what}: {exc.strerror}", fix)) from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            Problem(shown, f"line {line}", f"{what} is not UTF-8 text", "save it as UTF-8 (is this the right file?)")
        ) from None


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, mark=None):
        super().__init__(message)
        self.message = message
        self.mark = mark


class UserLoader(yaml.SafeLoader):
    """SafeLoader without aliases or duplicate keys, with limits on depth, size and node count."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused("YAML aliases (*name) are not accepted: write the value out", event.start_mark)
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values", self.peek_event().start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, ScalarNode) and len(node.value) > MAX_SCALAR:
            raise _Refused(f"a value of {len(node.value)} characters (at most {MAX_SCALAR})", node.start_mark)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = key_node.value
                    if key in seen:
                        raise _Refused(
                            f"duplicate key {key[:60]!r} (first on line {seen[key].line + 1}): YAML "
                            "would keep only the last one",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark
                elif isinstance(key_node, (MappingNode, SequenceNode)):
                    raise _Refused("a key must be a plain value", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str, fix: str = "fix the syntax") -> Any:
    """Parse user YAML (see the module doc). Errors name the line and column, never the text."""
    try:
        return yaml.load(text, Loader=UserLoader)  # UserLoader is a SafeLoader
    except _Refused as exc:
        raise ConfigError(Problem(source, _where(exc.mark), exc.message, fix)) from None
    except yaml.MarkedYAMLError as exc:
        what = (exc.problem or exc.context or "invalid YAML").strip()
        raise ConfigError(Problem(source, _where(exc.problem_mark), f"not valid YAML: {redact(what)}", fix)) from None
    except yaml.YAMLError:
        raise ConfigError(Problem(source, "", "not valid YAML", fix)) from None
    except RecursionError:
        raise ConfigError(Problem(source, "", f"nested too deeply (at most {MAX_DEPTH} levels)", fix)) from None


def load_yaml_file(path: Path, what: str, fix: str = "fix the syntax") -> Any:
    return parse_yaml(read_text(path, what), str(path), fix)


def _where(mark) -> str:
    return f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""


# Values that look like secrets: redacted from any error text (a secrets file given as an inventory, a token
# pasted into a recipe). Names as in recipes.SECRET_NAME; hf_/sk- are Hugging Face and LiteLLM key shapes.
_SECRET_ASSIGN = re.compile(
    r"([A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|API_KEY|MASTER_KEY|APIKEY)['\"]?\s*[=:]\s*)(\S+)", re.IGNORECASE
)
_SECRET_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{6,}|sk-[A-Za-z0-9_-]{6,}|(?:ghp|gho|xox[bp])_[A-Za-z0-9_-]{6,})")


def redact(text: str) -> str:
    text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + "********", text)
    return _SECRET_SHAPES.sub("********", text)


def parse_yaml_value(text: str, source: str) -> Any:
    """A YAML value given on the command line (`--set k=v`): not valid YAML means the plain string."""
    try:
        return yaml.load(text, Loader=UserLoader)  # UserLoader is a SafeLoader
    except _Refused as exc:
        raise ConfigError(Problem(source, "", exc.message, "write the value out")) from None
    except (yaml.YAMLError, RecursionError):
        return text
