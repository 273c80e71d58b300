"""The one fact layer: what a node has now, declared once per fact and read in one SSH round trip.

script.py what a fact is and the one script; catalog.py every fact (FACTS) and the sets readers ask for;
node.py the typed result (NodeFacts); parsers.py the tools' output parsers; read.py gather/read_facts (one node),
gather_facts (every node of a run, in parallel).
plan, preflight, status, top, doctor and dayzero (init, setup ssh, setup network) all read NodeFacts from here.
"""

from __future__ import annotations

from .catalog import FACTS
from .node import (
    MANIFEST,
    TEMP_SUFFIX,
    ContainerFact,
    DiskUsage,
    FileFact,
    GpuFact,
    NetworkFact,
    NodeFacts,
    RdmaFact,
    StateDirFact,
    UnreadFact,
    health_probes,
    hub_folder,
    parse_time,
    safe_name,
)
from .parsers import parse_sections
from .read import FACTS_TIMEOUT_S, SETS, add_resources, command, gather, gather_facts, parse, read_facts
from .script import EVERY_PORT, Fact, FactArgs

__all__ = [
    "EVERY_PORT",
    "FACTS",
    "FACTS_TIMEOUT_S",
    "MANIFEST",
    "SETS",
    "TEMP_SUFFIX",
    "ContainerFact",
    "DiskUsage",
    "Fact",
    "FactArgs",
    "FileFact",
    "GpuFact",
    "NetworkFact",
    "NodeFacts",
    "RdmaFact",
    "StateDirFact",
    "UnreadFact",
    "add_resources",
    "command",
    "gather",
    "gather_facts",
    "health_probes",
    "hub_folder",
    "parse",
    "parse_sections",
    "parse_time",
    "read_facts",
    "safe_name",
]
