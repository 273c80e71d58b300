"""The lab: a virtual cluster of DGX Sparks (Docker containers with real sshd, real Docker, real jumbo-frame
networks; the GPU and RDMA hardware simulated) for end-to-end tests and demos without hardware.

API: `up(LabSpec(...))`, `down(spec)`, `status(spec)`; `LabSpec().inventory_path` is the inventory to deploy
to (`--inventory lab` finds the default lab's).
"""

from sparkdeploy.lab.lifecycle import UpResult, down, up
from sparkdeploy.lab.nodestatus import NodeStatus, status
from sparkdeploy.lab.spec import LabSpec

__all__ = ["LabSpec", "NodeStatus", "UpResult", "down", "status", "up"]
