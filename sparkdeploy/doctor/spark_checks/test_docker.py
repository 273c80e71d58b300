"""The Docker engine runs, and can hand the GPU to a container: the `nvidia` runtime, or the NVIDIA container
toolkit's hook that `docker run --gpus` uses (what sparkdeploy's containers ask for)."""

import json

from testinfra.host import Host

HOOK = "nvidia-container-runtime-hook"


def test_engine_runs(host: Host) -> None:
    assert host.run("docker info --format '{{.ServerVersion}}'").rc == 0, "the Docker engine does not answer"


def test_nvidia_runtime(host: Host) -> None:
    runtimes = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
    hook = host.run("command -v %s", HOOK).stdout.strip()
    if hook:
        host.run("grep -m1 SIMULATED %s", hook)  # the lab's stand-in says what it stands in for
    assert "nvidia" in runtimes or hook, f"neither the nvidia runtime nor {HOOK} (runtimes: {sorted(runtimes)})"
