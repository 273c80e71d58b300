"""The programs that run ON the nodes, with the python3 they have: standard library only (hub_client: and the
engine image's huggingface_hub), no import of the rest of sparkdeploy (it is not installed there), modules
importing each other relatively.

This machine ships the package whole (ship.py: one deterministic zipapp in the command line) and runs one of its
programs (__main__.py):
  models        status, verify, send and receive a model's files (models.py)
  hub-client    in a container of the engine image: plan and download a model with huggingface_hub
  push-source   `images push --from`'s source: the layers the chain lacks, into the first hop (source.py)
  relay         each receiver of that chain: load what arrives and forward it to the next hop (relay.py)
  store-reader  as root on the source: those layers read from the Docker layer store (store_reader.py)
layers.py, archive.py and layer_store.py (docker archives and the layer store) serve these and this machine's
own `images push` alike.
"""
