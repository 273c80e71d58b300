"""sparkdeploy: recipes, topologies, checks and benchmarks for clusters of NVIDIA DGX Spark machines."""

__version__ = "0.1.0"
