"""The deploy pipeline as a library, in flow order: inventory + recipe -> deployment (context.py) -> facts ->
preflight -> plan -> apply -> health gate (up.py); down.py removes what up made; status.py reads what runs.

Each returns its result as data (the `--json` contract) and tells what it does through a Reporter (report.py):
the CLI's renders tables for people; the default one, for library callers such as `bench sweep`, writes
progress and warnings to stderr. Nothing here imports sparkdeploy.cli."""

# The health gate's default patience: loading a 65 GB model and compiling can take many minutes on a Spark.
# Here, not in up.py, so the CLI's options read it without importing the pipeline.
DEFAULT_TIMEOUT_S = 1200.0
