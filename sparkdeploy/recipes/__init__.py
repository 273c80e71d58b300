"""Recipes and what they render to: recipe.py (the recipe model: read, validated, resolved with `--set`),
catalogue.py (`recipes list` and `search`), eugr.py and importing.py (a community recipe's format, read and
imported), vllm_args.py (the `vllm serve` line of a resolved recipe), backend_features.py (which serving flags each
cluster backend honours), budget.py (the one memory budget of an engine on a node)."""
