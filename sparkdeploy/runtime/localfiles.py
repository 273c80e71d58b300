"""Writing files on this machine where another local user may be waiting (render --out /tmp/...).

A folder that will hold secrets must be this user's and writable by no one else (else another user could swap a
file for a symlink, or pre-create it readable); files are opened relative to the folder's descriptor, never
through a symlink, created new (O_EXCL) under a temporary name with their final mode, then renamed over the
final name (atomic: a reader sees the old file or the new one, never a half-written or wrongly-moded one).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from sparkdeploy.errors import ConfigError, Problem

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)


def _refuse(path: Path | str, message: str, fix: str) -> ConfigError:
    return ConfigError(Problem(str(path), "", message, fix))


def _check_private(fd: int, path: Path | str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise _refuse(
            path,
            "belongs to another user, who could read the secrets written there",
            "pass --out a new folder, or one of your own",
        )
    if st.st_mode & 0o022:
        raise _refuse(
            path,
            f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o}), who could swap a file for a symlink",
            f"chmod 700 {path}, or pass --out a new folder",
        )


def open_folder(path: Path, private: bool) -> int:
    """Create `path` (0700 when new) and return an fd on it; `private`: it must be ours and not group/other
    writable, and not a symlink."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise _refuse(path, "exists and is not a folder", "pass --out a folder") from None
    except OSError as exc:
        raise _refuse(
            path, f"cannot create the folder: {exc.strerror}", "pass --out a folder you can create and write"
        ) from None
    try:
        fd = os.open(path, DIR_FLAGS if private else os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        what = "is a symlink" if os.path.islink(path) else f"cannot open the folder: {exc.strerror}"
        raise _refuse(path, what, "pass --out a real folder of your own") from None
    try:
        if private:
            _check_private(fd, path)
        if not os.access(path, os.W_OK):
            raise _refuse(path, "is not writable", "pass --out a folder you can write")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_subfolder(parent_fd: int, name: str, shown: Path, private: bool) -> int:
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _refuse(shown, f"cannot create the folder: {exc.strerror}", "pass --out a folder you can write") from None
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise _refuse(
            shown, f"is not a folder of its own ({exc.strerror})", "remove it, or pass --out a new folder"
        ) from None
    if private:
        try:
            _check_private(fd, shown)
        except BaseException:
            os.close(fd)
            raise
    return fd


def write_atomic(dir_fd: int, name: str, content: str, mode: int, shown: Path) -> None:
    """Write `name` in the folder `dir_fd`: a new temp file with `mode`, then rename over `name`."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refuse(shown, f"cannot write: {exc.strerror}", "pass --out a folder you can write") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), mode)  # the umask may have narrowed it; never widened past `mode`
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise _refuse(shown, f"cannot write: {exc.strerror}", "pass --out a folder you can write") from None
