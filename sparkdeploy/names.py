"""The one name type: every name that reaches a file, a container, a label, a netplan key or a shell line.

Node, cluster, stack deployment, gateway key, interface, RDMA device (HCA), SSH user, recipe/image: each kind is
one pattern, checked by one function with a FULL match. `re.match("^...$")` is not one: `$` also matches before
a final newline, so "chat\\n" passed it and reached container names and netplan files. A name holding a control
character (a newline, ESC, ...) is refused before the pattern is tried, with the name shown escaped.

Schemas use the Annotated types (NodeName, ...); the CLI's arguments use `check` or `problem`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Annotated

from pydantic import AfterValidator

from sparkdeploy.errors import Invalid, Problem, escape_controls, has_controls


@dataclass(frozen=True)
class NameKind:
    what: str  # "a node name"
    pattern: re.Pattern[str]  # matched in full
    rule: str  # what it may hold, in words
    fix: str


LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
KINDS: dict[str, NameKind] = {
    "node": NameKind(
        "a node name", LABEL, "a label of letters, digits, '.', '_' and '-'", "rename the node (e.g. spark1)"
    ),
    "cluster": NameKind(
        "a cluster name", LABEL, "a label of letters, digits, '.', '_' and '-' (at most 63)", "e.g. sparks"
    ),
    "deployment": NameKind(
        "a deployment name",
        re.compile(r"[a-z0-9](?:[a-z0-9-]{0,22}[a-z0-9])?"),
        "lowercase letters, digits and '-', at most 24, not starting or ending with '-'",
        "e.g. coder",
    ),
    "key": NameKind(
        "a key name",
        re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}"),
        "letters, digits, '_', '.', '@', '-'; at most 64; not starting with '-'",
        "e.g. alice",
    ),
    "interface": NameKind(
        "a Linux interface name",
        re.compile(r"[A-Za-z0-9_.:-]{1,15}"),
        "at most 15 letters, digits, '_', '.', ':', '-'",
        "use the name `ip link` shows",
    ),
    "hca": NameKind(
        "an RDMA device name",
        re.compile(r"[A-Za-z0-9_.:-]{1,64}"),
        "letters, digits, '_', '.', ':', '-'",
        "use a name `ibv_devices` shows",
    ),
    "user": NameKind(
        "a user name",
        re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"),
        "letters, digits, '_', '.', '-'; at most 32; not starting with '-'",
        "write the login name on the node",
    ),
    "plain": NameKind(
        "a plain name",
        re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"),
        "letters, digits, '.', '_', '-'; at most 128; no '/' or spaces; not starting with '-'",
        "check the value",
    ),
}


def error(kind: str, value: object) -> tuple[str, str] | None:
    """(what is wrong, the fix) when `value` is not a `kind` name; None when it is one."""
    k = KINDS[kind]
    if not isinstance(value, str):
        return f"{k.what} is text, not {type(value).__name__}", k.fix
    if has_controls(value):
        return (
            f"{escape_controls(repr(value[:80]))} is not {k.what}: it holds a newline or another control character",
            "write it on one line, with printable characters only",
        )
    if not k.pattern.fullmatch(value) or value in (".", ".."):
        return f"{value[:80]!r} is not {k.what} ({k.rule})", k.fix
    return None


def check(kind: str, value: str) -> str:
    """`value` if it is a `kind` name, else Invalid (a ValueError: the schemas' validators raise it)."""
    found = error(kind, value)
    if found:
        raise Invalid(*found)
    return value


def one_line(value: str) -> str:
    """Free text that lands in a file, a message or a terminal line (a path, a --set value): one line."""
    if has_controls(value):
        raise Invalid(
            "holds a newline or another control character", "write it on one line, with printable characters only"
        )
    return value


def problem(kind: str, value: object, file: str, field: str) -> Problem | None:
    """The one-line problem for a name given on the command line (None: it is a `kind` name)."""
    found = error(kind, value)
    return Problem(file, field, *found) if found else None


NodeName = Annotated[str, AfterValidator(partial(check, "node"))]
ClusterName = Annotated[str, AfterValidator(partial(check, "cluster"))]
DeploymentName = Annotated[str, AfterValidator(partial(check, "deployment"))]
KeyName = Annotated[str, AfterValidator(partial(check, "key"))]
InterfaceName = Annotated[str, AfterValidator(partial(check, "interface"))]
HcaName = Annotated[str, AfterValidator(partial(check, "hca"))]
UserName = Annotated[str, AfterValidator(partial(check, "user"))]
PlainName = Annotated[str, AfterValidator(partial(check, "plain"))]
OneLine = Annotated[str, AfterValidator(one_line)]
