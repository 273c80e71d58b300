"""Registry images: a recipe's `image:` naming a registry reference instead of an image definition.

`image: nvcr.io/nvidia/vllm:26.01-py3@sha256:...` (or `host:port/repo:tag`, any reference Docker pulls) is
parsed here, in one place (`parse_reference`). Such an image is pulled ONCE, on one node, with that node's own
`docker pull` (its credentials stay in the node's Docker config: never on a command line here), its digest is
checked against the one pinned (RepoDigests, as the engine recorded it), and the other nodes get it node to node
over the fabric with `images push --from`'s chain (push_from.py): the bytes never pass through this machine.

sparkdeploy did not build such an image, so the CLI its vLLM accepts is read from the image itself: `vllm serve
--help=all` (or `--help`, which older releases and vllm-sim print whole) run once in a throw-away container on
the node (no network), parsed into the flag list `images/vllm_cli.check_args` uses for our own images, and kept in
the local state by image digest, so `recipes lint`, `--set` checks and `up` check its flags like ours.

The lab proves this against a real registry of its own (sparkdeploy/lab/registry_server.py: Debian's docker-registry).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.images import push_from
from sparkdeploy.images.image_ref import RegistryRef, known_digest, parse_reference, record, save
from sparkdeploy.images.inventory_images import NodeImages, read_node_images
from sparkdeploy.runtime.remote import NodeConnection, on_nodes

CLI_TIMEOUT_S = 300  # `vllm serve --help=all` imports torch: tens of seconds on a Spark
PULL_TIMEOUT_S = 3 * 3600  # an NGC vLLM image is 10-20 GB
# Read in a throw-away container: the vLLM version, then the whole help of `vllm serve`. A constant script.
CLI_SCRIPT = "vllm --version 2>/dev/null | tail -n 1; echo ---; vllm serve --help=all 2>/dev/null || vllm serve --help"
SIMULATED_LABEL = "io.sparkdeploy.simulated"

# -- the CLI, read from the image -----------------------------------------------------------------------------

# An option line of argparse's help: two to six spaces, then "-x, --flag VALUE" or "--flag {a,b}" ...
_OPTION_LINE = re.compile(r"^ {1,6}(-{1,2}[A-Za-z0-9].*?)(?: {2,}|$)")
_OPTION = re.compile(r"(-{1,2}[A-Za-z0-9][\w.+-]*)(?:[ =](.+))?")


def parse_help(text: str) -> dict[str, Any]:
    """`vllm serve --help` text -> {"flags": {flag: {"takes_value", "choices"?}}} (images/vllm_cli.check_args' format).
    Every option string of a line is a flag; one followed by a metavar takes a value; `{a,b}` lists its choices."""
    flags: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        m = _OPTION_LINE.match(line)
        if not m:
            continue
        for part in m.group(1).split(", "):
            om = _OPTION.fullmatch(part.strip())
            if not om:
                continue
            flag, meta = om.group(1), (om.group(2) or "").strip()
            entry: dict[str, Any] = {"takes_value": bool(meta)}
            if meta.startswith("{") and "}" in meta:
                entry["choices"] = [c for c in meta[1 : meta.index("}")].split(",") if c]
            if flag not in ("-h", "--help"):
                flags.setdefault(flag, entry)
    return {"flags": flags}


def read_cli(conn: NodeConnection, tag: str) -> tuple[str, dict[str, Any]]:
    """(vLLM version, flag list) of the image, from its own `vllm` in a throw-away container with no network."""
    argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", tag, "-c", CLI_SCRIPT]
    result = conn.run(argv, check=False, timeout=CLI_TIMEOUT_S)
    version, _, help_text = result.stdout.partition("---\n")
    spec = parse_help(help_text)
    if len(spec["flags"]) < 5:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-2:])
        raise StepFailed(
            f"{conn.node.name}: could not read the `vllm serve` CLI of {tag} (exit {result.exit_code}): "
            f"{tail[:300] or 'no option in its help'}; is it a vLLM image?"
        )
    return version.strip().splitlines()[-1].strip() if version.strip() else "", spec


# -- pull once, check the digest, spread over the fabric --------------------------------------------------------


@dataclass
class PullResult:
    reference: str
    local_tag: str
    node: str  # the node that pulled (or held it)
    digest: str
    image_id: str
    pulled: bool  # False: a node had it already
    vllm_version: str = ""
    simulated: bool = False
    warnings: list[str] = field(default_factory=list)
    pushed: list[dict[str, Any]] = field(default_factory=list)  # per target: what it got
    failed: dict[str, str] = field(default_factory=dict)  # target -> why

    def as_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "local_tag": self.local_tag,
            "node": self.node,
            "digest": self.digest,
            "image_id": self.image_id,
            "pulled": self.pulled,
            "vllm_version": self.vllm_version,
            "simulated": self.simulated,
            "warnings": self.warnings,
            "pushed": self.pushed,
            "failed": self.failed,
        }


def _pull_failure(node: str, ref: RegistryRef, output: str) -> StepFailed:
    lines = [x.strip() for x in output.strip().splitlines() if x.strip()]
    last = (lines[-1] if lines else "no output")[:300]
    low = output.lower()
    if ref.digest and ("manifest unknown" in low or "not found" in low):
        return StepFailed(
            f"{node}: {ref.registry} has no {ref.repository} with the pinned digest {ref.digest}: the digest does "
            f"not match, refused (nothing was pulled or changed); fix: pin the digest the registry serves "
            f"(sparkdeploy images pull {ref.repository}:{ref.tag or 'latest'} --on {node} names it)"
        )
    unreachable = ("dial tcp", "no such host", "connection refused", "i/o timeout", "server gave http response")
    if any(word in low for word in unreachable) or "timeout" in low:
        return StepFailed(
            f"{node}: cannot reach the registry {ref.registry}: {last}; fix: check the node's network and "
            "proxy, and `docker pull` there by hand"
        )
    if "unauthorized" in low or "denied" in low or "authentication required" in low:
        return StepFailed(
            f"{node}: {ref.registry} refused the pull of {ref.repository} ({last}); fix: on {node}, "
            f"`docker login {ref.registry}` (the credentials stay in that node's Docker config)"
        )
    return StepFailed(f"{node}: docker pull {ref.pull_ref} failed: {last}")


def _hub_name(repository: str) -> str:
    """Docker Hub's short form, as the engine writes RepoDigests: docker.io/library/x -> x."""
    return repository.removeprefix("docker.io/").removeprefix("library/")


_INSPECT = '{"id":{{json .Id}},"digests":{{json .RepoDigests}},"labels":{{json .Config.Labels}}}'


def _inspect(conn: NodeConnection, ref: str) -> dict[str, Any] | None:
    r = conn.run(["docker", "image", "inspect", "--format", _INSPECT, ref], check=False, timeout=60)
    if r.exit_code != 0:
        return None
    data = json.loads(r.stdout.strip().splitlines()[-1])
    return data if isinstance(data, dict) else None


def pull_on(conn: NodeConnection, ref: RegistryRef) -> tuple[str, dict[str, Any], list[str]]:
    """`docker pull` on the node, then the digest check. Returns (digest, inspect data, warnings)."""
    r = conn.run(["docker", "pull", "--quiet", ref.pull_ref], check=False, timeout=PULL_TIMEOUT_S)
    if r.exit_code != 0:
        raise _pull_failure(conn.node.name, ref, (r.stderr or "") + "\n" + (r.stdout or ""))
    data = _inspect(conn, ref.pull_ref)
    if data is None:
        raise StepFailed(f"{conn.node.name}: {ref.pull_ref} was pulled but the engine does not show it")
    digests = [
        d.split("@", 1)[1]
        for d in data.get("digests") or []
        if "@" in d and _hub_name(d.split("@", 1)[0]) == _hub_name(ref.repository)
    ]
    warnings: list[str] = []
    if ref.digest:
        if ref.digest not in digests:
            raise StepFailed(
                f"{conn.node.name}: {ref.repository}: the engine records digest(s) {', '.join(digests) or 'none'}, "
                f"not the pinned {ref.digest}: refused (not sent to any other node, no container changed)"
            )
        digest = ref.digest
    else:
        if not digests:
            raise StepFailed(f"{conn.node.name}: {ref.pull_ref} was pulled but the engine recorded no digest for it")
        digest = digests[0]
        warnings.append(
            f"{ref.text} names no digest: it resolved to {digest} on {conn.node.name}; pin it so every later "
            f"pull is this image: image: {ref.pinned(digest)}"
        )
    if ref.local_tag != ref.pull_ref:
        conn.run(["docker", "tag", ref.pull_ref, ref.local_tag], timeout=60)
    return digest, data, warnings


def _holder(
    inventory: Inventory, nodes: list[Node], ref: RegistryRef, image_id: str | None
) -> tuple[Node | None, dict[str, str | None]]:
    """Every node's images (in parallel); the first node holding the local tag with the recorded image ID."""
    outcomes = on_nodes(nodes, lambda n: _read(inventory, n))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise StepFailed("; ".join(str(o.error) for o in failed))
    ids = {o.node.name: (o.value.image(ref.local_tag).id if o.value.image(ref.local_tag) else None) for o in outcomes}
    if image_id:
        for node in nodes:
            if ids.get(node.name) == image_id:
                return node, ids
    return None, ids


def _read(inventory: Inventory, node: Node) -> NodeImages:
    with NodeConnection(node, inventory) as conn:
        return read_node_images(conn)


def pull_and_spread(
    text: str,
    inventory: Inventory,
    nodes: list[Node],
    on: Node | None = None,
    say: Callable[[str], None] = lambda _line: None,
    read_vllm_cli: bool = True,
) -> PullResult:
    """Make every node of `nodes` hold the registry image `text` with one image ID: pulled once (on `on`, else
    on a node that has it already with the recorded digest, else the first node), digest checked, CLI read once
    (kept by digest), then sent node to node over the fabric to the nodes that lack it. read_vllm_cli False: an
    image of another engine (SGLang), whose flags are checked against its engine's pinned dump instead."""
    ref = parse_reference(text)
    digest = known_digest(ref)
    rec = record(digest) if digest else None
    holder, ids = _holder(inventory, nodes, ref, (rec or {}).get("image_id"))
    # `images pull --on NODE` pulls there; `up` pulls only when no node holds the recorded image yet
    source = on or holder or nodes[0]
    pulled = False
    warnings: list[str] = []
    if on is not None or holder is None:
        say(f"pulling {ref.pull_ref} on {source.name} (once; the other nodes get it over the fabric)")
        with NodeConnection(source, inventory) as conn:
            digest, data, warnings = pull_on(conn, ref)
            pulled = True
            rec = record(digest)
            if not read_vllm_cli:
                rec = {
                    "reference": ref.text,
                    "digest": digest,
                    "image_id": data["id"],
                    "vllm_version": "",
                    "simulated": bool((data.get("labels") or {}).get(SIMULATED_LABEL)),
                    "cli": None,
                    "read_on": source.name,
                }
            elif not rec or rec.get("image_id") != data["id"] or not rec.get("cli"):
                say(f"reading the vLLM CLI of {ref.local_tag} on {source.name} (once per digest)")
                version, cli = read_cli(conn, ref.local_tag)
                rec = {
                    "reference": ref.text,
                    "digest": digest,
                    "image_id": data["id"],
                    "vllm_version": version,
                    "simulated": bool((data.get("labels") or {}).get(SIMULATED_LABEL)),
                    "cli": cli,
                    "read_on": source.name,
                }
            save(ref, digest, rec)
        ids[source.name] = rec["image_id"]
    assert digest is not None and rec is not None
    result = PullResult(
        ref.text,
        ref.local_tag,
        source.name,
        digest,
        rec["image_id"],
        pulled,
        rec.get("vllm_version") or "",
        bool(rec.get("simulated")),
        warnings,
    )
    lacking = [n for n in nodes if n.name != source.name and ids.get(n.name) != rec["image_id"]]
    if lacking:
        say(f"sending {ref.local_tag} from {source.name} to {', '.join(n.name for n in lacking)} over the fabric")
        _plan, outcomes, _received = push_from.push_from_node(ref.local_tag, inventory, source, lacking)
        for o in outcomes:
            if o.ok:
                result.pushed.append(o.value.as_dict())
            else:
                result.failed[o.node.name] = str(o.error)
    return result


def dry_run_lines(text: str, nodes: list[Node], on: Node | None) -> list[str]:
    """What `images pull --dry-run` would do (connects to nothing)."""
    ref = parse_reference(text)
    digest = known_digest(ref)
    source = on or nodes[0]
    others = [n.name for n in nodes if n.name != source.name]
    out = [
        f"pull {ref.pull_ref} once, on {source.name} (its own docker pull and Docker credentials)",
        (
            f"check the digest: the engine's RepoDigests must list {ref.digest}"
            if ref.digest
            else "no digest pinned: warn with the digest it resolves to" + (f" (last time {digest})" if digest else "")
        ),
        f"tag it {ref.local_tag} on the nodes",
        "read its vLLM CLI once (vllm serve --help=all in a container with no network), kept by digest"
        + (" (already kept)" if digest and (record(digest) or {}).get("cli") else ""),
    ]
    if others:
        out.append(
            f"send it node to node over the fabric from {source.name} to {', '.join(others)} (images push --from)"
        )
    return out


def restore_command(text: str, node: str | None = None) -> str:
    return f"sparkdeploy images pull {shlex.quote(text)}" + (f" --on {shlex.quote(node)}" if node else "")
