"""No process a test starts outlives it, none outlives the suite, and a signal a test sends arrives (issue 44).

The plugin (tests/support/processes.py) is exercised on a small suite of its own, run by pytest in a subprocess:
a test that leaves a process running, one that leaves an orphan (its parent exited), and a module fixture that
never stops its process. The first two are killed when their test ends; the third fails the run, named.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import REPO
from tests.support.processes import spawn

LEAKY = textwrap.dedent("""
    import subprocess
    from pathlib import Path

    import pytest

    OUT = Path(__file__).parent

    def test_leaves_a_child_running():
        p = subprocess.Popen(["sleep", "300"])
        (OUT / "child.pid").write_text(str(p.pid))
        assert False, "a failing test: its child must not outlive it"

    def test_leaves_an_orphan():
        # the shell exits at once; its `sleep` is re-parented (to pytest, the subreaper)
        out = subprocess.run(["sh", "-c", "sleep 301 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        (OUT / "orphan.pid").write_text(out.stdout.strip())

    @pytest.fixture(scope="module")
    def server():
        p = subprocess.Popen(["sleep", "302"])
        (OUT / "server.pid").write_text(str(p.pid))
        yield p  # never stopped

    def test_uses_a_module_fixture(server):
        assert server.poll() is None
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _suite(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """pytest run on the suite in tmp_path, with the plugin under test."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.processes"]\n')
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )


def test_leaks_are_killed_and_a_process_left_after_the_session_fails_the_run(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    run = _suite(tmp_path)
    pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name in ("child", "orphan", "server")}
    try:
        assert run.returncode == 1, run.stdout + run.stderr
        assert "1 failed, 2 passed" in run.stdout, run.stdout
        assert "processes the suite started are still alive (killed now):" in run.stdout, run.stdout
        assert f"pid {pids['server']}: sleep 302" in run.stdout, run.stdout
        assert "sleep 300" not in run.stdout and "sleep 301" not in run.stdout, run.stdout  # killed with their test
        for name, pid in pids.items():
            assert not _alive(pid), f"the {name} process {pid} outlived the suite"
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_spawn_starts_the_child_with_sigint_at_its_default_whatever_the_suite_ignores():
    """`cmd &` in a script starts the suite with SIGINT ignored; a Ctrl-C a test sends must still arrive."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the suite runs under `(bash scripts/test.sh &)`
    try:
        plain = subprocess.Popen(["sleep", "30"])
        spawned = spawn(["sleep", "30"])
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        assert os.getpgid(spawned.pid) == spawned.pid  # its own process group: its children are found with it
        for p in (plain, spawned):
            p.send_signal(signal.SIGINT)
        assert spawned.wait(5) == -signal.SIGINT
        time.sleep(0.3)
        assert plain.poll() is None, "the inherited SIG_IGN was not there: this test shows nothing"
    finally:
        plain.kill()
        plain.wait()


def test_a_containers_shim_re_parented_to_the_suite_and_what_runs_below_it_are_dockers_not_the_suites(tmp_path):
    """A shim daemonizes: when the suite started the Docker engine, it is re-parented to pytest (the subreaper).
    It and its container's processes are the engine's: a process a lab node's engine starts in a test (a gateway
    `docker restart`ed) is not killed when that test ends. Before, it was (the next test: connection refused).
    A plain orphan of the same test is still killed."""
    shim = tmp_path / "containerd-shim-runc-v2"  # a copy of sleep under a shim's name: its command name says so
    shim.write_bytes(Path("/bin/sleep").read_bytes())
    shim.chmod(0o755)
    (tmp_path / "shim.sh").write_text(f"{shim} 303 >/dev/null 2>&1 & echo $!\n")
    (tmp_path / "test_shim.py").write_text(
        textwrap.dedent("""
        import subprocess
        from pathlib import Path

        OUT = Path(__file__).parent

        def test_the_engine_starts_a_container():
            run = lambda cmd: subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout.strip()
            (OUT / "shim.pid").write_text(run(f"sh {OUT / 'shim.sh'}"))  # re-parented to pytest: an orphan
            (OUT / "orphan.pid").write_text(run("sleep 304 >/dev/null 2>&1 & echo $!"))

        def test_next():
            assert (OUT / "shim.pid").exists()
        """)
    )
    run = _suite(tmp_path)
    pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name in ("shim", "orphan")}
    try:
        assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout + run.stderr
        assert _alive(pids["shim"]), "the shim was killed with the test that started it"
        assert not _alive(pids["orphan"]), "a plain orphan outlived its test"
        assert "still alive" not in run.stdout, run.stdout
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
