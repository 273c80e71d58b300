"""Image definitions (images/<name>/), content-hash tags, local builds and layer-aware pushes: this machine's side.

What runs on the nodes during a push (`push --from`'s source, relay and store reader) and the archive and layer
store code both sides share live in sparkdeploy/nodeside/, shipped whole (nodeside/ship.py)."""
