"""Capture a real sample of EVERY registered fact from the lab: tests/facts/samples/lab-every-fact.txt.

Runs the one facts script (facts.command: every name of FACTS) on the lab's head node over SSH (the lab's
inventory, pinned host keys), asking for the lab's simulated engine image (present) and one that is not there,
every en* interface's speed, and `sudo -n -l` of the programs `setup ssh` needs. The file is the script's output
as the node printed it; tests/facts/test_fact_samples.py parses it (and fails when a registered fact has no
section there). Run it again when a fact is added:

    export SPARKDEPLOY_LAB_INSTANCE=... SPARKDEPLOY_LAB_SUBNETS=... SPARKDEPLOY_STATE=...   # your lab
    python3 scripts/capture_fact_samples.py

It brings the default lab up (idempotent: a lab already up is reused). Nothing on the node changes: every fact
only looks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sparkdeploy import facts
from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.dayzero import sudo_needs
from sparkdeploy.lab import LabSpec, up
from sparkdeploy.runtime.session import Session

OUT = Path(__file__).resolve().parent.parent / "tests" / "facts" / "samples" / "lab-every-fact.txt"
ABSENT = "sparkdeploy/nope:000000000000"


def main() -> int:
    lab = up(LabSpec())
    inventory = load_inventory(lab.inventory)
    head = inventory.head
    image = inventory.cluster.image_override or "vllm-sim"  # the lab's: the simulated engine's definition
    repo = image if "/" in image else f"sparkdeploy/{image}"
    with Session.open(inventory) as session:
        conn = session.conn(head)
        present = conn.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repo], check=False)
        refs = tuple(r for r in (*present.stdout.split()[:1], ABSENT) if r)
        args = facts.FactArgs(
            state_dir=inventory.cluster.state_dir,
            hf_cache=inventory.cluster.hf_cache,
            model_folder=facts.hub_folder("Qwen/Qwen3-0.6B"),
            fabric_ifaces=(facts.EVERY_PORT,),
            images=refs,
            sudo_programs=tuple(sudo_needs.commands()),
        )
        result = conn.run(facts.command(list(facts.FACTS), args), check=False, timeout=facts.FACTS_TIMEOUT_S)
    missing = [name for name in facts.FACTS if name not in facts.parse_sections(result.stdout)]
    if missing:
        print(f"{head.name}: no section for {', '.join(missing)} (exit {result.exit_code})", file=sys.stderr)
        return 1
    OUT.write_text(result.stdout)
    print(f"{OUT}: {len(facts.FACTS)} facts from {head.name} ({len(result.stdout)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
