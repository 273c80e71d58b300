#!/usr/bin/env python3
"""Lockstep serving under torchrun (seed 004), for real vLLM (external_launcher) and for vllm-sim.

    torchrun --nnodes 2 --node-rank R --nproc-per-node 1 --master-addr HEAD_FABRIC_IP --master-port 29500 \
        /opt/sparkdeploy/launcher/serve_torchrun.py MODEL -tp 2 --host 0.0.0.0 --port 8000 [vllm serve options]

Rank 0 serves the OpenAI API and broadcasts each batch of new requests to the other ranks over gloo; every
rank steps its engine in lockstep. See sparklaunch/torchrun.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sparklaunch.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
