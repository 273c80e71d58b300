"""Benchmarks of a served recipe: llama-benchy runs (runner), stored results (store), reports (report),
topology sweeps (sweep), the seeds' reference tables (reference) and the topology advisor (advisor)."""
