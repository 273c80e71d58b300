"""Secrets (HF token, proxy master key): read from the secrets file or the environment, never printed.

They reach the nodes only inside `secrets.env` (mode 0600, written over SFTP) and containers only by
`--env-file`; a `Secrets` object masks itself in repr() so a stray log line cannot leak one.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sparkdeploy.errors import ConfigError, Problem

KNOWN = ("HF_TOKEN", "LITELLM_MASTER_KEY")
MASK = "********"


@dataclass
class Secrets:
    values: dict[str, str] = field(default_factory=dict)
    source: str = ""
    warnings: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # never the values
        return f"Secrets(names={sorted(self.values)}, source={self.source!r})"

    __str__ = __repr__

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def require(self, name: str, why: str) -> str:
        value = self.values.get(name)
        if not value:
            raise ConfigError(Problem(self.source or "secrets", name, f"is not set ({why})",
                                      f"add {name}=... to the secrets file or export {name}"))
        return value

    def mask(self, text: str) -> str:
        """Replace every secret value in `text` (for anything printed or logged)."""
        for value in sorted(self.values.values(), key=len, reverse=True):
            if value:
                text = text.replace(value, MASK)
        return text


def parse_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):]
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            # never echo the line: it may hold a secret
            raise ConfigError(Problem(f"{path}:{lineno}", "", "expected NAME=value", "fix that line"))
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def load_secrets(path: Path | None, environ: dict[str, str] | None = None) -> Secrets:
    environ = dict(os.environ) if environ is None else environ
    secrets = Secrets(source=str(path) if path else "environment")
    if path is not None and path.is_file():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            secrets.warnings.append(f"{path} is readable by others (mode {mode:04o}): chmod 600 {path}")
        secrets.values.update(parse_env_file(path))
    for name in KNOWN:  # the environment wins, as users expect from an exported variable
        if environ.get(name):
            secrets.values[name] = environ[name]
    return secrets
