"""The deploy pipeline as a library. Its stages, in flow order after the deployment (topologies/context.py) and the
facts (facts/): preflight.py (the checks `up` runs over the facts it read), plan.py (what to change, as data),
apply.py (the plan's steps on the nodes), health.py (the gate). Their orchestrators: up.py runs them (with
fabric_gate.py, registry_image.py, history.py beside it), down.py removes what up made, status.py reads what runs,
serving.py guards what serves against the commands that would break it, stack/ the stacks behind one gateway.

Each returns its result as data (the `--json` contract) and tells what it does through a Reporter (progress.py):
the CLI's renders tables for people; the default one, for library callers such as `bench sweep`, writes
progress and warnings to stderr. Nothing here imports sparkdeploy.cli."""

# The health gate's default patience: loading a 65 GB model and compiling can take many minutes on a Spark.
# Here, not in up.py, so the CLI's options read it without importing the pipeline.
DEFAULT_TIMEOUT_S = 1200.0
