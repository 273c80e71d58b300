"""Build image definitions with the Docker SDK.

`ensure_image(name)` builds the chain of bases first and skips any image whose content-hash tag already
exists, so a second call costs one API round trip. Two kinds of definition:
- `dockerfile`: a normal build; pinned wheels are downloaded on this machine first (containers here cannot
  reach PyPI through the TLS-intercepting proxy, and it keeps builds reproducible and offline);
- `rootfs`: a Debian root filesystem made with debootstrap and `docker import`ed (no registry needed).
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import io
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.definitions import LABEL, ImageDefinition, load_definition

if TYPE_CHECKING:
    from docker import DockerClient

    from sparkdeploy.runtime.remote import NodeConnection

Progress = Callable[[str], None]


def docker_client() -> DockerClient:
    import docker  # the docker SDK: about 180 ms to import, which `up` and `status` never need

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - the SDK raises several kinds; all mean "no engine"
        raise StepFailed(
            f"no Docker engine answers on this machine ({exc.__class__.__name__}); start it "
            "(for example: bash .ci/start-docker.sh)"
        ) from None
    return client


def image_exists(client: DockerClient, ref: str) -> bool:
    import docker  # the docker SDK: about 180 ms to import, which `up` and `status` never need

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(
    name: str, client: DockerClient | None = None, progress: Progress | None = None, force: bool = False
) -> str:
    """Build `name` (and its bases) unless its tag is present; return the tag."""
    client = client or docker_client()
    say = progress or _print
    definition = load_definition(name)
    base = definition.base_definition()
    base_tag = ensure_image(base.name, client, progress) if base else definition.base
    tag = definition.tag
    if not force and image_exists(client, tag):
        return tag
    # Two processes (a test and `lab up`, say) may want the same image: one builds, the other waits and
    # then finds the tag. The wheels folder is shared too, so the lock covers the download as well.
    with _build_lock(name):
        if not force and image_exists(client, tag):
            return tag
        needs = definition.build_needs
        here = platform.machine()
        if needs and needs.arch and here != needs.arch:  # e.g. CUDA kernels for arm64 on an x86 laptop: hours
            raise StepFailed(
                f"{name} must be built on {needs.arch} and this machine is {here}: build it on a node "
                f"(sparkdeploy images build {name} --on NODE), then images push {name} --from NODE"
            )
        say(f"building {tag}")
        if definition.kind == "rootfs":
            _build_rootfs(definition, client, tag, say)
        else:
            _build_dockerfile(definition, client, tag, base_tag, say)
    return tag


@contextlib.contextmanager
def _build_lock(name: str) -> Iterator[None]:
    """One build of an image at a time on this machine, whatever the state folder: what it guards (the engine's
    tag, the checkout's wheels folder) is shared by processes with different SPARKDEPLOY_STATE (CI's two lab shards,
    tests/support/lab_shards.py), like the lab's own lock (lab/lifecycle.py _lab_lock)."""
    with open(Path(tempfile.gettempdir()) / f"sparkdeploy-image-{name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _print(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        raise StepFailed(f"{what} failed (exit {result.returncode}):\n{tail}")


# Bookworm's python3 (the images' interpreter) is 3.11, whatever Python runs sparkdeploy.
TARGET_PYTHON = "3.11"
MANYLINUX = ["manylinux2014"] + [f"manylinux_2_{minor}" for minor in range(17, 37)]
ARCHES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}


def wheel_target_args(platform: str, python: str = TARGET_PYTHON) -> list[str]:
    """pip options that fetch wheels for the image's platform and Python, not this machine's."""
    arch = ARCHES.get(platform)
    if arch is None:
        raise StepFailed(f"no wheel platform known for {platform}")
    abi = "cp" + python.replace(".", "")
    args = [
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for tag in MANYLINUX:
        args += ["--platform", f"{tag}_{arch}"]
    args += ["--platform", f"linux_{arch}"]
    return args


def download_wheels(definition: ImageDefinition, say: Progress) -> None:
    """Fetch the pinned wheels for the image into <definition>/wheels (kept between builds)."""
    if not definition.requirements:
        return
    assert definition.directory is not None
    req = definition.directory / definition.requirements
    wheels = definition.directory / "wheels"
    wheels.mkdir(exist_ok=True)
    stamp = wheels / ".requirements"
    wanted = f"{definition.platform}\n{req.read_text()}"
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    say(f"downloading wheels for {definition.name} ({definition.platform}, Python {TARGET_PYTHON})")
    # An image's requirements are a complete hashed lock (scripts/lock.py): exactly its files, nothing resolved.
    # Resolving again would ask the index for the newest release of a package a dependency names with an extra
    # (pip 23 does), which the lock does not hash: the build would break the day that release appears.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--require-hashes",
            "--no-deps",
            "-d",
            str(wheels),
            *wheel_target_args(definition.platform),
            "-r",
            str(req),
        ],
        f"pip download for image {definition.name}",
    )
    stamp.write_text(wanted)


def build_context(definition: ImageDefinition) -> io.BytesIO:
    """A tar of the definition's files, its included folders and its downloaded wheels."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for arcname, path in definition.context_files():
            tar.add(str(path), arcname=arcname, recursive=False)
        wheels = definition.directory / "wheels" if definition.directory else None
        if definition.requirements and wheels and wheels.is_dir():
            for path in sorted(wheels.iterdir()):
                if path.is_file() and not path.name.startswith("."):
                    tar.add(str(path), arcname=f"wheels/{path.name}", recursive=False)
    buf.seek(0)
    return buf


def _build_dockerfile(
    definition: ImageDefinition, client: DockerClient, tag: str, base_tag: str | None, say: Progress
) -> None:
    download_wheels(definition, say)
    args = dict(definition.build_args)
    if base_tag:
        args["BASE"] = base_tag
    context = build_context(definition)
    log: list[str] = []
    step = "?"
    for chunk in client.api.build(
        fileobj=context,
        custom_context=True,
        tag=tag,
        buildargs=args,
        rm=True,
        forcerm=True,
        labels={LABEL: definition.name},
        decode=True,
    ):
        if "stream" in chunk:
            for line in chunk["stream"].splitlines():
                if line.startswith("Step "):
                    step = line
                    say(f"  {definition.name}: {line}")
                log.append(line)
        if "error" in chunk:
            tail = "\n".join(log[-30:])
            raise StepFailed(f"building image {definition.name} failed at {step}: {chunk['error'].strip()}\n{tail}")


def _build_rootfs(definition: ImageDefinition, client: DockerClient, tag: str, say: Progress) -> None:
    opts = definition.rootfs
    suite = opts.get("suite", "bookworm")
    mirror = opts.get("mirror", "http://deb.debian.org/debian")
    argv = ["debootstrap", f"--variant={opts.get('variant', 'minbase')}"]
    if opts.get("include"):
        argv.append("--include=" + ",".join(opts["include"]))
    with tempfile.TemporaryDirectory(prefix="sparkdeploy-rootfs-") as tmp:
        root = Path(tmp) / "root"
        say(f"  {definition.name}: debootstrap {suite} (about a minute)")
        _run(argv + [suite, str(root), mirror], f"debootstrap for image {definition.name}")
        # Keep the image small and reproducible-ish: no apt lists or caches.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        archive = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(archive), "."], "packing the root filesystem")
        repo, version = tag.rsplit(":", 1)
        changes = [
            f"LABEL {LABEL}={definition.name}",
            'CMD ["/bin/bash"]',
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ]
        with open(archive, "rb") as fh:
            client.api.import_image_from_data(fh, repository=repo, tag=version, changes=changes)
    if not image_exists(client, tag):
        raise StepFailed(f"docker import of {definition.name} did not produce {tag}")


# -- building on a node -------------------------------------------------------------------------------------

STEP_LINE = re.compile(r"Step (\d+)/(\d+) : (.*)")
HEARTBEAT_S = 30.0


def remote_build_argv(definition: ImageDefinition, tag: str, base_tag: str | None) -> list[str]:
    """`docker build -` on the node: the context arrives on stdin; the classic builder, as on this machine."""
    argv = [
        "env",
        "DOCKER_BUILDKIT=0",
        "docker",
        "build",
        "--rm",
        "--force-rm",
        "-t",
        tag,
        "--label",
        f"{LABEL}={definition.name}",
    ]
    args = dict(definition.build_args)
    if base_tag:
        args["BASE"] = base_tag
    for key in sorted(args):
        argv += ["--build-arg", f"{key}={args[key]}"]
    return argv + ["-"]


def build_on_node(
    name: str,
    conn: NodeConnection,
    progress: Progress | None = None,
    step: Callable[[int, int, str], None] | None = None,
    timeout: float = 3600,
) -> str:
    """Build definition `name` with the node's own engine: the build context (files, included folders, the
    wheels downloaded here) is sent over SSH to `docker build -`. Its base must already be on the node (push
    it first). `step(n, total, text)` is called at each build step. Returns the tag; a failed build raises
    StepFailed naming the step that failed, with the build's last lines.
    """
    from sparkdeploy.images.channel import FeedChannel  # channel -> remote -> fabric: ~20 ms `lab up` skips

    say = progress or _print
    definition = load_definition(name)
    if definition.kind == "rootfs":
        raise StepFailed(
            f"{name} is a root filesystem made with debootstrap on this machine, not a Dockerfile: "
            f"build it here and push it (sparkdeploy images push {name})"
        )
    base = definition.base_definition()
    base_tag = base.tag if base else definition.base
    tag = definition.tag
    download_wheels(definition, say)
    # gzip: `docker build -` tells a context from a Dockerfile by its first 1 KiB, and a tar that opens with a
    # PAX header (Python's default format) does not pass as one; a compressed stream always does.
    context = gzip.compress(build_context(definition).getvalue(), compresslevel=1)
    say(f"{conn.node.name}: building {tag} (context {len(context) / 1e6:.1f} MB)")
    state: dict[str, Any] = {
        "step": "before the first step",
        "partial": b"",
        "last": "",
        "since": time.monotonic(),
        "said": time.monotonic(),
    }

    def on_output(data: bytes) -> None:
        lines = (state["partial"] + data).split(b"\n")
        state["partial"] = lines.pop()
        for raw in lines:
            text = raw.decode(errors="replace").strip()
            match = STEP_LINE.fullmatch(text)
            if match:
                state.update(step=match.group(0), since=time.monotonic(), said=time.monotonic())
                if step:
                    step(int(match.group(1)), int(match.group(2)), match.group(3))
            elif text == "---> Using cache":  # Docker's cache: a rerun after a failure skips finished steps
                say(f"{conn.node.name}: {state['step'].split(' : ')[0]} already built (cache)")
            elif text:
                state["last"] = text
        now = time.monotonic()
        if now - state["said"] >= HEARTBEAT_S and state["last"]:  # long steps (nvcc) still show they move
            state["said"] = now
            say(
                f"{conn.node.name}: {state['step'].split(' : ')[0]}, {(now - state['since']) / 60:.0f} min: "
                f"{state['last'][:150]}"
            )

    channel = FeedChannel(conn, remote_build_argv(definition, tag, base_tag), on_output=on_output)
    try:
        for offset in range(0, len(context), 1 << 20):
            channel.put(context[offset : offset + (1 << 20)])
        code, output = channel.finish(timeout)
    except BaseException:
        channel.abort()
        raise
    if code != 0 or channel.error:
        lines = [line for line in output.splitlines() if line.strip()]
        tail = "\n".join(lines[-30:])
        why = f"exit {code}" if code is not None else (channel.error or "no exit status")
        raise StepFailed(f"{conn.node.name}: building image {name} failed at {state['step']} ({why}):\n{tail}")
    return tag


def main(argv: list[str] | None = None) -> int:
    """`python -m sparkdeploy.images.build NAME...` builds definitions (the CLI's `images build --local` too)."""
    names = argv if argv is not None else sys.argv[1:]
    client = docker_client()
    for name in names:
        print(ensure_image(name, client))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
