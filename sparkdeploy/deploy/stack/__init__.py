"""Several deployments on one cluster behind one gateway (`up --stack stack.yaml`): file.py (the stack file, its
validation and memory shares), units.py (the gateway and guard units), converge.py (plans and converges them, and
takes them down), routes.py (the gateway's routes, derived from what runs; take out / put back), keys.py (the
gateway's per-user keys, `sparkdeploy keys`). What runs inside the gateway's container: nodeside/gateway/."""
