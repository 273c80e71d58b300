"""What runs in a container on the download node: the real huggingface_hub client (the engine image has it).

Run as `hub-client plan|download|pull REPO REVISION [PATTERN...]` (patterns: only the files they match) of this
package's archive (ship.argv), its python3 the engine image's (or the one its engine names, models/ops.py): a
`docker run` of that image with the hub cache mounted at HF_HOME and an env file (0600) holding HF_TOKEN and
HF_ENDPOINT: the token never appears in an argument. Why the engine image: vLLM images always carry
huggingface_hub (vLLM reads models with it), the image is on the node already, and the client then matches what
the engine will read.

plan:     resolve REVISION to a commit and list the files (with LFS sha256): the manifest, on stdout as JSON.
download: snapshot_download of that commit into HF_HOME/hub (huggingface_hub resumes its own .incomplete
          files, and names each blob by its etag: sha256 for LFS files, the git blob id otherwise).
pull:     plan, then wait for one line on stdin: "go" downloads that commit, anything else stops. One
          container and one client for both (the CLI checks room on every node in between).
Errors are one JSON line {"error": KIND, "message": ...} and exit 3, for the CLI to turn into a fix.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from typing import Any, NoReturn

import huggingface_hub
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile


def fail(kind: str, message: str) -> NoReturn:
    print(json.dumps({"error": kind, "message": message[:500]}))
    sys.exit(3)


def manifest(repo: str, revision: str, include: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    api = HfApi()
    info = api.model_info(repo, revision=revision)
    files = []
    for f in api.list_repo_tree(repo, revision=info.sha, recursive=True):
        if not isinstance(f, RepoFile):
            continue
        if include and not any(fnmatch.fnmatch(f.path, pattern) for pattern in include):
            continue  # `models pull --include`: one quant of a GGUF repo, not all of them
        blob = f.lfs.sha256 if f.lfs is not None else f.blob_id
        files.append({"path": f.path, "size": f.size, "blob": blob, "lfs": f.lfs is not None})

    return {
        "repo": repo,
        "commit": info.sha,
        "revision": revision,
        "files": files,
        "total": sum(f["size"] for f in files),
        "client": "huggingface_hub " + huggingface_hub.__version__,
    }


def main(argv: list[str]) -> int:
    cmd, repo, revision, include = argv[0], argv[1], argv[2], list(argv[3:])
    allow = include or None

    try:
        if cmd == "plan":
            print(json.dumps(manifest(repo, revision, include)))
        elif cmd == "pull":
            plan = manifest(repo, revision, include)
            print(json.dumps(plan), flush=True)
            if sys.stdin.readline().strip() == "go":
                path = snapshot_download(repo, revision=plan["commit"], max_workers=4, allow_patterns=allow)
                print(json.dumps({"path": path}))
        elif cmd == "download":
            path = snapshot_download(repo, revision=revision, max_workers=4, allow_patterns=allow)
            print(json.dumps({"path": path}))
        else:
            fail("usage", "unknown command " + cmd)
    except GatedRepoError as exc:
        fail("gated", str(exc).splitlines()[0])
    except RevisionNotFoundError as exc:
        fail("revision", str(exc).splitlines()[0])
    except RepositoryNotFoundError as exc:
        fail("repo", str(exc).splitlines()[0])
    except HfHubHTTPError as exc:
        fail("http", str(exc).splitlines()[0])
    except OSError as exc:
        fail("io", f"{exc.__class__.__name__}: {exc}")
    # Broad on purpose: this program's contract is one JSON line and exit 3, never a traceback, whatever else
    # huggingface_hub raises (its own errors, ValueError for a malformed repo id).
    except Exception as exc:  # noqa: BLE001
        fail("error", f"{exc.__class__.__name__}: {str(exc)[:300]}")
    return 0
