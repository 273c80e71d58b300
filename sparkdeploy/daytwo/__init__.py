"""Day two: views of what runs. logs.py (the containers' logs, merged by time, secrets masked), top.py (each engine's
load from its /metrics), crashes.py (why a container stopped: `status` and doctor's engine.crashes read it),
postmortem.py (the memory guard's black box read back after a crash, power-off or guard kill)."""
