"""What every run stands on, this machine's side of the nodes: remote.py (one host-key-checked SSH connection per
node, `on_nodes`, the typed remote errors), session.py (a run's connections), locks.py (one run per cluster: the
local flock and the lock on the nodes), interrupts.py (SIGINT and SIGTERM for every command, a run's `Interrupt`),
holds.py (the lab tests' hold points), peers.py (node-to-node SSH over the fabric), thread_imports.py (imports
before any thread pool), localfiles.py (writing files on this machine safely)."""
