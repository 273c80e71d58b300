"""What a user hands us, validated before anything connects anywhere: userfile.py (the one door every file a user
or a node hands us comes through), schema.py (pydantic errors as one-line problems), inventory.py (the cluster and
its nodes), fabric_mesh.py (a direct mesh's cables), guard_settings.py (`cluster.guard`, also a recipe's `guard:`),
secrets.py (secrets.env and the mask)."""
