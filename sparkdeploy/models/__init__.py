"""Model weights, downloaded once and copied node to node over the fabric (`sparkdeploy models ...`).

ops.py         this machine's side of the node programs (sparkdeploy/nodeside/: models.py runs on a node,
               status/verify, send/receive a copy, record a complete model; hub_client.py runs in a container
               of the engine image on the download node, the real huggingface_hub): argv, parsing, errors
pull.py        the pull: plan (sizes, room on every node) -> download on one node -> chain copy -> verify
listing.py     `models list` and the check `up` runs before starting any engine
"""
