"""Benchmarks of a served recipe: llama-benchy runs (benchy; _benchy_main its child), stored results (store),
reports (report), topology sweeps (sweep), the seeds' reference tables (seeds) and the topology advisor (advisor)."""
