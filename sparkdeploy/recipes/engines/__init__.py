"""The serving engines a recipe names (`engine: vllm | sglang | llamacpp`), one module each behind one interface.

interface.py is the interface (`Engine`: the launch argv from the recipe and the topology, health and readiness
paths, the metrics names `top` reads, the memory reservation the budget counts, the tool and reasoning parsers,
the model files it reads, the flag list it is checked against) and `Distributed` (how a process takes part in a
multi-node engine). vllm.py, sglang.py and llamacpp.py implement it; registered.py registers them (ENGINES):
adding an engine (TensorRT-LLM) is one module and one line there. The engine's `serve_args` is the ONE place its
command line is written: topologies call it and nothing else writes an engine's flags.
"""
