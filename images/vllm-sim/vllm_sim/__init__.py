"""vllm-sim: a vLLM-compatible simulated engine, the lab's stand-in for a GB10 running vLLM 0.32.

No GPU and no weights: it accepts vLLM's command line, serves vLLM's OpenAI API and metrics, and
answers with placeholder text at the speed a timing model of continuous batching on a bandwidth-bound
GPU predicts (calibrated against the seeds' gpt-oss-120b tables, docs/calibration.md).

Entry points: `vllm serve ...` (cli.main), `python -m vllm_sim serve ...`, the SimEngine class
(engine.py) and the virtual-time predictor (predict.py).
"""

__version__ = "0.1.0"
