"""sparklaunch: an OpenAI-compatible front end and a lockstep engine loop for multi-rank serving.

Why it exists: vLLM's `external_launcher` backend (torchrun) works only with the offline engine
classes, so serving under torchrun needs a launcher (seed 004): rank 0 serves HTTP and broadcasts each
batch of new requests to every rank over gloo; all ranks step the engine in lockstep. The same front
end and loop serve the simulated engine (vllm_sim) in the lab, which is how the launcher gets tested
without a GPU.

Modules: protocol (what travels), api (HTTP), driver (engine loop), control (rank coordination),
metrics (Prometheus text), adapters (engine back ends: real vLLM here, the sim in vllm_sim.adapter).
"""

__version__ = "0.1.0"
