"""Where recipes, templates and image definitions live.

A checkout keeps them at the top level; an installed wheel carries them in sparkdeploy/data. A user's own
recipes come first when given with --recipes-dir or SPARKDEPLOY_RECIPES.
"""

from __future__ import annotations

import os
from pathlib import Path

from sparkdeploy.errors import ConfigError, Problem, has_controls

PACKAGE_DIR = Path(__file__).resolve().parent


def _data_root() -> Path:
    checkout = PACKAGE_DIR.parent
    if (checkout / "recipes").is_dir() and (checkout / "templates").is_dir():
        return checkout
    return PACKAGE_DIR / "data"


def data_dir(name: str) -> Path:
    return _data_root() / name


def recipe_dirs(extra: str | os.PathLike[str] | None = None) -> list[Path]:
    """Search order: --recipes-dir, then SPARKDEPLOY_RECIPES (os.pathsep separated), then the shipped ones."""
    dirs: list[Path] = []
    if extra:
        dirs.append(Path(extra).expanduser())
    env = os.environ.get("SPARKDEPLOY_RECIPES")
    if env:
        dirs.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)
    dirs.append(data_dir("recipes"))
    return dirs


def templates_dir() -> Path:
    return data_dir("templates")


def images_dir() -> Path:
    return data_dir("images")


def state_dir() -> Path:
    """Local state (the lab's keys and inventory, bench results): $SPARKDEPLOY_STATE or XDG state home."""
    env = os.environ.get("SPARKDEPLOY_STATE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "sparkdeploy"


def lab_dir() -> Path:
    return state_dir() / "lab"


BARE_NOTES = "bare.json"  # a bare lab's notes in its folder (lab/bare.py writes them, `init` reads them)


def bare_lab_notes() -> list[Path]:
    """The notes of every bare lab of this machine (`sparkdeploy lab up --bare`)."""
    return sorted(state_dir().glob(f"lab*/{BARE_NOTES}"))


def state_unwritable(path: Path, exc: OSError) -> ConfigError:
    """The one line for a local state folder this process cannot create or write (never a traceback)."""
    where = "SPARKDEPLOY_STATE" if os.environ.get("SPARKDEPLOY_STATE") else "the default state folder"
    return ConfigError(
        Problem(
            str(path),
            "",
            f"cannot write the local state folder ({where}): {exc.strerror or exc}",
            "set SPARKDEPLOY_STATE to a folder this user can write, e.g. "
            "export SPARKDEPLOY_STATE=~/.local/state/sparkdeploy",
        )
    )


def state_folder(*parts: str, path: Path | None = None) -> Path:
    """A folder of the local state (state_dir()/parts, or `path`), created 0700 if missing and checked writable.
    Every local state write (digest keys, cluster locks, the lab's files) makes its folder here."""
    folder = path if path is not None else state_dir().joinpath(*parts)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise state_unwritable(folder, exc) from None
    return folder


def confined(folder: Path, name: str, what: str) -> Path:
    """`folder`/`name` for a file name taken from a record or a file (a history record's recipe, an imported
    recipe's name): one plain name that stays inside `folder`, else ConfigError before anything is written."""
    text = str(name)
    plain = (
        text not in ("", ".", "..")
        and "/" not in text
        and "\\" not in text
        and not has_controls(text)
        and len(text) <= 255
    )
    path = folder / text
    if not plain or path.resolve().parent != folder.resolve():
        raise ConfigError(
            Problem(
                str(folder),
                what,
                f"{text[:80]!r} would leave the folder {folder} (a file name is one plain name)",
                "restore the value as sparkdeploy wrote it",
            )
        )
    return path
