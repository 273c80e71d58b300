"""Secrets (HF token, proxy master key): read from the secrets file or the environment, never printed.

They reach the nodes only inside `secrets.env` (mode 0600, written over SFTP) and containers only by
`--env-file`; a `Secrets` object masks itself in repr() so a stray log line cannot leak one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as secrets_module
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sparkdeploy import paths
from sparkdeploy.config.userfile import read_text
from sparkdeploy.errors import ConfigError, Problem

KNOWN = ("HF_TOKEN", "LITELLM_MASTER_KEY")
MASK = "********"


@dataclass
class Secrets:
    values: dict[str, str] = field(default_factory=dict)
    source: str = ""
    warnings: list[str] = field(default_factory=list)
    missing: str = ""  # the secrets file named in the inventory that does not exist (`up` refuses to run)

    def __repr__(self) -> str:  # never the values
        return f"Secrets(names={sorted(self.values)}, source={self.source!r})"

    __str__ = __repr__

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def require(self, name: str, why: str) -> str:
        value = self.values.get(name)
        if not value:
            raise ConfigError(
                Problem(
                    self.source or "secrets",
                    name,
                    f"is not set ({why})",
                    f"add {name}=... to the secrets file or export {name}",
                )
            )
        return value

    def mask(self, text: str) -> str:
        """Replace every secret value in `text` (for anything printed or logged)."""
        for value in sorted(self.values.values(), key=len, reverse=True):
            if value:
                text = text.replace(value, MASK)
        return text


def refuse_missing(secrets: Secrets) -> None:
    """For a command that deploys: a secrets file named in the inventory must exist (a typo in its path
    must not start a proxy without its master key)."""
    if secrets.missing:
        raise ConfigError(
            Problem(
                secrets.missing,
                "",
                "the secrets file (cluster.secrets_file) does not exist",
                "create it with NAME=value lines (HF_TOKEN, LITELLM_MASTER_KEY) and chmod 600, "
                "or fix the path in the inventory",
            )
        )


def parse_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    text = read_text(
        path,
        "secrets file",
        "fix cluster.secrets_file in the inventory, or create the file (NAME=value lines, chmod 600)",
    )
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :]
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
    if path is not None and not os.path.lexists(path):
        # A dry run or render of the example inventory still works; `up` refuses (secrets.refuse_missing).
        secrets.missing = str(path)
        secrets.warnings.append(
            f"{path} (cluster.secrets_file) does not exist: nothing is read from it, and "
            "`up` will refuse to run until it does (create it: NAME=value lines, chmod 600)"
        )
    elif path is not None:  # anything else wrong with it (a folder, unreadable, not UTF-8) is an error now
        values = parse_env_file(path)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            secrets.warnings.append(f"{path} is readable by others (mode {mode:04o}): chmod 600 {path}")
        secrets.values.update(values)
    for name in KNOWN:  # the environment wins, as users expect from an exported variable
        if environ.get(name):
            secrets.values[name] = environ[name]
    return secrets


# -- the key of the secret-file digests ----------------------------------------------------------------------
# A container's config hash must change when its secrets change, yet it is printed (dry run, --json) and stored
# where others read it (Docker labels, `status`). A plain hash of secrets.env would let anyone who reads it try
# guesses offline, so the secrets' part is an HMAC under a random key per cluster, kept in the local state
# (0600). Another machine has its own key: its first `up` restarts the containers once (or copy the key file).

KEY_BYTES = 32


def digest_key_path(cluster_id: str) -> Path:
    return paths.state_dir() / "keys" / f"{cluster_id}.key"


def digest_key(cluster_id: str) -> bytes:
    path = digest_key_path(cluster_id)
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # the state folder is a file, unreadable, ...: one line with the fix
        raise paths.state_unwritable(path.parent, exc) from None
    paths.state_folder(path=path.parent)
    key = secrets_module.token_bytes(KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another run made it first: use theirs
        return _read_key(path)
    except OSError as exc:
        raise paths.state_unwritable(path.parent, exc) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.hex().encode() + b"\n")
    except OSError as exc:  # a full disk: leave no empty key behind (the next run would refuse it)
        os.unlink(path)
        raise paths.state_unwritable(path.parent, exc) from None
    return key


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(4 * KEY_BYTES).decode(errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(Problem(str(path), "", "not a sparkdeploy digest key", "remove it (a new one is made)"))
    return key


def keyed_digest(key: bytes, content: str) -> str:
    return hmac.new(key, content.encode(), hashlib.sha256).hexdigest()
