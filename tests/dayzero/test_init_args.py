"""Issue 35 item 6: `init` and `setup` check every argument before connecting, one line per problem, never
pydantic's text.

Before: `--user 'spark;x'` and `--hosts 127.0.0.1,127.0.0.2` printed a raw ValidationError (a traceback), a
`--fabric-subnet` that is no CIDR or IPv6 failed after connecting, `--password-file /dev/zero` was read before
its mode was checked (MemoryError), a non-UTF-8 password or known_hosts file was a UnicodeDecodeError. Every
connect is refused and recorded here: none may be tried.
"""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def offline(monkeypatch):
    tried: list[str] = []

    def refuse(self, address, *_a):
        tried.append(str(address))
        raise ConnectionRefusedError(111, "refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return tried


def refused(code: int, err: str, *needles: str) -> list[str]:
    assert code == 2, err
    assert "Traceback" not in err and "validation error" not in err and "Value error" not in err, err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), err
    for needle in needles:
        assert needle in err, err
    return lines


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--hosts", "127.0.0.1", "--user", "spark;x"], "'spark;x' is not a user name"),
        (["--hosts", "127.0.0.1", "--user", "spark\n"], "control character"),
        (["--hosts", "127.0.0.1", "--user", "-oProxyCommand=touch PWNED"], "is not a user name"),
        (["--hosts", "127.0.0.1,127.0.0.2"], "127.0.0.2 is a loopback address"),
        (["--hosts", "127.0.0.1", "--fabric-subnet", "not-a-cidr"], "'not-a-cidr' is not a subnet"),
        (["--hosts", "127.0.0.1", "--fabric-subnet", "2001:db8::/64"], "is IPv6"),
        (["--hosts", "127.0.0.1", "--fabric-subnet", "10.0.0.0/31"], "holds no address for 1 node"),
        (["--hosts", "127.0.0.1", "--fabric-subnet", "127.0.0.0/8"], "loopback range"),
        (["--hosts", "127.0.0.1", "--key", "/dev/zero"], "not a regular file"),
    ],
)
def test_init_checks_every_argument_before_connecting(cli, tmp_path, offline, args, needle):
    code, _out, err = cli("init", "--out", str(tmp_path / "inv.yaml"), "--yes", *args)
    refused(code, err, needle)
    assert offline == []


def test_init_reports_every_bad_argument_at_once(cli, tmp_path, offline):
    code, _out, err = cli(
        "init", "--hosts", "127.0.0.1,127.0.0.2", "--user", "a b", "--fabric-subnet", "x", "--out", str(tmp_path / "i")
    )
    lines = refused(code, err)
    assert len(lines) == 4 and all(f in err for f in ("--hosts", "--user", "--fabric-subnet")), err
    assert offline == []


@pytest.mark.parametrize(
    "content, mode, needle",
    [
        ("DEVZERO", 0o600, "not a regular file"),
        (b"\xff\xfe\n", 0o600, "not UTF-8"),
        (b"secret\n", 0o644, "can be read by others"),
        (b"x" * 10_000, 0o600, "more than 4096"),
        (b"two\nlines\n", 0o600, "not one line"),
    ],
)
@pytest.mark.parametrize("command", [["init", "--hosts", "127.0.0.1", "--yes"], ["setup", "ssh", "--dry-run"]])
def test_password_files_go_through_the_door(cli, tmp_path, inventory_file, offline, command, content, mode, needle):
    pw = tmp_path / "pw"
    if content == "DEVZERO":
        pw.symlink_to("/dev/zero")
    else:
        pw.write_bytes(content)
        pw.chmod(mode)
    extra = ["-i", str(inventory_file)] if command[0] == "setup" else ["--out", str(tmp_path / "inv.yaml")]
    refused(*cli(*command, *extra, "--password-file", str(pw))[::2], "--password-file", needle)
    assert offline == []


def test_init_known_hosts_and_setup_login_key_go_through_the_door(cli, tmp_path, inventory_file, offline):
    kh = tmp_path / "kh"
    kh.write_bytes(b"\xff host\n")
    refused(*cli("init", "--hosts", "127.0.0.1", "--known-hosts", str(kh), "--out", str(tmp_path / "i"))[::2])
    for key, needle in [("/dev/zero", "not a regular file"), (str(tmp_path / "nope"), "no such file")]:
        refused(*cli("setup", "ssh", "-i", str(inventory_file), "--dry-run", "--login-key", key)[::2], needle)
    assert offline == []
