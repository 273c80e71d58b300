"""`sparkdeploy doctor`: checks registered in one place (registry.py), run in parallel over one SSH connection
per node (runner.py, doctor_run.py), each in its group's module (access, containers, endpoint, engine, gpu,
guard_crash, image, inventory_checks, network_checks, roce); the report's table (table.py); `--nccl` runs the
all-reduce probe (nccl_probe.py, probe/allreduce_probe.py)."""

# The NCCL probe's folder in the state dir (nccl_probe.py writes it; `down` removes it, plan.OUR_FOLDERS). Here,
# not in nccl_probe.py, so the plan names it without importing doctor's checks.
DOCTOR_FOLDER = "doctor"
