"""The memory guard: what runs in the `sparkdeploy-guard` container on every engine node (issue #29).

Standard library only, no import of the rest of sparkdeploy (relative imports inside). It ships in its own small
image, images/guard (this folder is that image's `include`), and runs as `python3 -m guard CONFIG` (JSON).
memory.py reads the node's memory and pressure, ring.py is the black box (one format, read back by this machine's
`postmortem` and `doctor`), dockerapi.py speaks to the node's Docker engine through its socket, run.py is the loop.
"""
