"""The NVIDIA driver and CUDA the recipes need: the vllm-node image is CUDA 13 (images/vllm-node/manifest.yaml),
which runs on a CUDA 13.0 driver or newer (minor-version compatibility), so driver 580 or newer."""

import re

from testinfra.host import Host

DRIVER_AT_LEAST = (580, 0)
CUDA_AT_LEAST = (13, 0)


def version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:2])


def test_driver(host: Host) -> None:
    driver = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader").splitlines()[0]
    assert version(driver) >= DRIVER_AT_LEAST, (
        f"driver {driver}: the recipes' image needs {DRIVER_AT_LEAST[0]} or newer"
    )


def test_cuda(host: Host) -> None:
    found = re.search(r"CUDA Version: ([\d.]+)", host.check_output("nvidia-smi"))
    assert found, "nvidia-smi shows no CUDA Version"
    assert version(found.group(1)) >= CUDA_AT_LEAST, f"CUDA {found.group(1)} is older than 13.0"
