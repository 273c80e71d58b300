"""Runs INSIDE an engine image (`docker run --entrypoint python3 IMAGE -c BOOT APP image-versions`: doctor's
image.torch_nccl, sparkdeploy/doctor/image.py): the torch, CUDA, NCCL and vLLM versions the image carries, as one
`@@versions@@ JSON` line. Standard library only; what the image lacks is the finding, never a crash."""

from __future__ import annotations

import json


def versions() -> dict[str, object]:
    out: dict[str, object] = {}
    # Broad on purpose: torch in an unknown image fails in many ways (ImportError, OSError for a missing CUDA
    # library, RuntimeError from a build without NCCL), importing it or asking it; each failure is the finding.
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        try:
            v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # noqa: BLE001 - any failure is the finding (above)
            out["nccl"] = None
            out["nccl_error"] = (type(exc).__name__ + ": " + str(exc))[:160]
        try:
            import torch.distributed as dist

            out["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
        except Exception:  # noqa: BLE001 - any failure is the finding (above)
            out["nccl_backend"] = False
    except Exception as exc:  # noqa: BLE001 - any failure is the finding (above)
        out["torch"] = None
        out["torch_error"] = (type(exc).__name__ + ": " + str(exc))[:160]
    try:
        import importlib.metadata as md

        out["vllm"] = md.version("vllm")
    except ImportError:  # PackageNotFoundError: no vLLM in this image
        out["vllm"] = None
    return out


def main(argv: list[str]) -> int:
    print("@@versions@@" + json.dumps(versions()))
    return 0
