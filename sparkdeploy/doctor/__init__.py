"""`sparkdeploy doctor`: checks registered in one place (registry.py), run in parallel over one SSH connection
per node (runner.py, session.py), each in its group's module; `--nccl` runs the all-reduce probe
(nccl_probe.py, probe/allreduce_probe.py)."""
