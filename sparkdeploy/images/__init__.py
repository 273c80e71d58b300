"""Image definitions (images/<name>/), content-hash tags, local builds and layer-aware pushes."""
