"""The one door for every file a user or a node hands us: read here, with the same limits and one-line errors.

Inventories, recipes (ours and community ones), stack files, secrets and password files, known_hosts and key
files, the local history, and the JSON a node returns (the gateway's keys and manifest) all come through here:
- a file must exist, be a regular file (not /dev/zero, a FIFO or a folder: checked on the open descriptor
  before a byte is read), be readable, hold UTF-8 and be at most `limit` bytes (MAX_FILE_BYTES by default);
  `private`: also readable by its owner only (a password file), checked before reading;
- YAML is parsed with SafeLoader, but aliases (`*name`, the way to a "billion laughs" bomb) and duplicate keys
  (YAML keeps the last one silently: a recipe could serve another model than the one read first) are refused,
  nesting stops at MAX_DEPTH (a 5000-deep list would be a RecursionError) and no string exceeds MAX_SCALAR;
- JSON the same: duplicate keys refused (json keeps the last), NaN/Infinity refused, nesting at most MAX_DEPTH;
- an error never quotes the file's text (a secrets file given by mistake would be echoed): only line and column.
The types of what was read are the schemas' business (sparkdeploy/config/schema.py: strict, no bool for a number).
tests/test_hostile_files.py fails if another module of the package reads a user's file or parses YAML itself.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Hashable
from pathlib import Path
from typing import Any, Protocol

import yaml
from yaml.events import Event
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sparkdeploy.errors import ConfigError, Problem, has_controls

MAX_FILE_BYTES = 1 << 20  # an inventory or recipe is a few KB
MAX_DEPTH = 32
MAX_SCALAR = 4096
MAX_NODES = 100_000


def read_text(
    path: Path | str,
    what: str = "file",
    fix: str = "check the path",
    *,
    limit: int = MAX_FILE_BYTES,
    private: bool = False,
) -> str:
    """The file's text, or a ConfigError naming the path and the fix (missing, folder, not a regular file, too big,
    unreadable, readable by others when `private`, not UTF-8)."""
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
        if st.st_size > limit:
            raise ConfigError(
                Problem(shown, "", f"{what} is {st.st_size} bytes, more than {limit}", "is this the right file?")
            )
        if private and st.st_mode & 0o077:
            raise ConfigError(
                Problem(
                    shown,
                    "",
                    f"the {what} can be read by others (mode {stat.S_IMODE(st.st_mode):04o})",
                    f"chmod 600 {shown}",
                )
            )
        data = _read_all(fd, limit, shown, what, fix)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            Problem(shown, f"line {line}", f"{what} is not UTF-8 text", "save it as UTF-8 (is this the right file?)")
        ) from None


def _read_all(fd: int, limit: int, shown: str, what: str, fix: str) -> bytes:
    """At most `limit` bytes (a file that grows while read is refused, never read on without end)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        except OSError as exc:
            raise ConfigError(Problem(shown, "", f"cannot read the {what}: {exc.strerror}", fix)) from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise ConfigError(Problem(shown, "", f"{what} is more than {limit} bytes", "is this the right file?"))


def present_file_problems(path: Path | str, what: str, file: str, field: str) -> list[Problem]:
    """A file named by a setting or an option that another program reads later (a private key for ssh, a
    known_hosts file): it may not exist yet (it will be created), but if it does, it passes the door now, before
    anything connects. One line per problem, the setting named."""
    text = str(path)
    if has_controls(text):
        return [Problem(file, field, "the path holds a newline or another control character", "write it on one line")]
    p = Path(text).expanduser()
    if not (p.exists() or p.is_symlink()):
        return []
    try:
        read_text(p, what)
    except ConfigError as exc:
        return [Problem(file, field, f"{problem.file}: {problem.message}", problem.fix) for problem in exc.problems]
    return []


class _Mark(Protocol):
    """Where in the text a YAML event or node starts (yaml's pure-Python and C marks both have these)."""

    line: int
    column: int


class _Refused(yaml.YAMLError):
    def __init__(self, message: str, mark: _Mark | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


class UserLoader(yaml.SafeLoader):
    """SafeLoader without aliases or duplicate keys, with limits on depth, size and node count."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def _next_mark(self) -> _Mark | None:
        """Where the next event starts (for the line and column of a refusal)."""
        event: Event = self.peek_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves Parser.peek_event unannotated
        return event.start_mark

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            raise _Refused("YAML aliases (*name) are not accepted: write the value out", self._next_mark())
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep", self._next_mark())
        if self._nodes > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES} values", self._next_mark())
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, ScalarNode) and len(node.value) > MAX_SCALAR:
            raise _Refused(f"a value of {len(node.value)} characters (at most {MAX_SCALAR})", node.start_mark)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
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


def load_yaml_file(path: Path | str, what: str, fix: str = "fix the syntax") -> Any:
    return parse_yaml(read_text(path, what), str(path), fix)


def parse_json(text: str, source: str, where: str = "", fix: str = "fix the JSON") -> Any:
    """Parse JSON from a user's file or a node's answer: duplicate keys, NaN/Infinity and nesting deeper than
    MAX_DEPTH are refused; an error names the line and column (`where`: the caller's place, e.g. "line 3"),
    never the text."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _JsonRefused as exc:
        raise ConfigError(Problem(source, where, str(exc), fix)) from None
    except json.JSONDecodeError as exc:
        at = where or f"line {exc.lineno} column {exc.colno}"
        raise JsonSyntaxError(Problem(source, at, f"not valid JSON: {exc.msg}", fix)) from None
    except RecursionError:
        raise ConfigError(Problem(source, where, f"nested more than {MAX_DEPTH} levels deep", fix)) from None
    if _too_deep(value):
        raise ConfigError(Problem(source, where, f"nested more than {MAX_DEPTH} levels deep", fix))
    return value


def load_json_file(path: Path | str, what: str, fix: str = "fix the JSON", *, limit: int = MAX_FILE_BYTES) -> Any:
    return parse_json(read_text(path, what, limit=limit), str(path), fix=fix)


class JsonSyntaxError(ConfigError):
    """Not JSON at all (a cut write, the wrong file), as opposed to JSON that is refused (duplicate keys, NaN,
    too deep): a reader of an append-only file may skip such a line."""


class _JsonRefused(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonRefused(f"duplicate key {key[:60]!r}: JSON readers would keep only the last one")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise _JsonRefused(f"{name} is not a JSON number")


def _too_deep(value: Any, level: int = 1) -> bool:
    """More than MAX_DEPTH lists or objects inside each other (the walk stops there)."""
    if not isinstance(value, (dict, list)):
        return False
    if level > MAX_DEPTH:
        return True
    return any(_too_deep(v, level + 1) for v in (value.values() if isinstance(value, dict) else value))


def _where(mark: _Mark | None) -> str:
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
