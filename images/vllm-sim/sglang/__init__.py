"""SIMULATED SGLang for the lab: `python3 -m sglang.launch_server` of vllm-sim (launch_server.py)."""
