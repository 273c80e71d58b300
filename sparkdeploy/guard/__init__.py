"""The memory guard, this machine's side (issue #29): its inventory settings (settings.py), the container `up`
adds to every engine node (deploy.py), its state as `status`, `top` and `logs` show it (state.py), the black box
read back by `postmortem` and `doctor` (postmortem.py). What runs on the node is sparkdeploy/nodeside/guard/."""
