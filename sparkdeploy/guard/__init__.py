"""The memory guard, this machine's side (issue #29): its state as `status`, `top` and `logs` show it (state.py) and
the guard lines `up` refuses once it has read the nodes (lines.py). Elsewhere, each in its stage: its inventory
settings (config/guard_settings.py), the container `up` adds to every engine node (topologies/guard.py), the black
box read back by `postmortem` (daytwo/postmortem.py) and doctor's guard.crash (doctor/guard_crash.py). What runs on
the node is sparkdeploy/nodeside/guard/."""
