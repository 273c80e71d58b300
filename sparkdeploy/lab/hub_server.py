"""The lab's model hub: a small server speaking the Hugging Face Hub's file API (standard library only).

It runs in the lab's hub container (python3 of the lab-node image) and `huggingface_hub` talks to it through
HF_ENDPOINT, exactly as it talks to huggingface.co: repo info (/api/models/R/revision/REV), the recursive tree
listing (/api/models/R/tree/REV, with each file's git blob id and, for LFS files, sha256 and size), and
resolve URLs answering HEAD and GET with X-Repo-Commit, ETag, X-Linked-Etag / X-Linked-Size for LFS files and
Range requests (the client resumes a cut download with them). Unknown repos and revisions get the hub's
X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound); a gated repo wants the lab's HF token.

Why not olah (PyPI, a self-hosted mirror): its offline local-mirror mode answers without X-Linked-Etag,
X-Linked-Size and Range (so no resume), reads each LFS file whole into memory per request, and brings
fastapi, GitPython and huggingface_hub>=1.27 into the lab image. This one is what the hub's protocol needs.

Repositories are folders made by sparkdeploy.lab.hub_repo: ROOT/ORG/NAME/meta.json + files/PATH.
It counts what it serves (GET /_lab/stats) and logs every request, so tests can prove "the hub served it once".

Usage: python3 hub_server.py ROOT PORT [TOKEN_FILE]
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20
API_RE = re.compile(r"/api/models/([^/]+)/([^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?")
RESOLVE_RE = re.compile(r"/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)")


class Hub:
    def __init__(self, root: str, token: str):
        self.root = root
        self.token = token
        self.lock = threading.Lock()
        self.stats: dict[str, Any] = {"requests": 0, "bytes": 0, "repos": {}}

    def repo(self, org: str, name: str) -> dict[str, Any] | None:
        path = os.path.join(self.root, org, name, "meta.json")
        if "/" in org + name or org.startswith(".") or name.startswith(".") or not os.path.isfile(path):
            return None
        with open(path) as fh:
            meta: dict[str, Any] = json.load(fh)
        meta["dir"] = os.path.join(self.root, org, name, "files")
        meta["id"] = f"{org}/{name}"
        return meta

    def count(self, repo_id: str, path: str, sent: int) -> None:
        with self.lock:
            self.stats["bytes"] += sent
            per = self.stats["repos"].setdefault(repo_id, {"bytes": 0, "files": {}})
            per["bytes"] += sent
            per["files"][path] = per["files"].get(path, 0) + sent


class Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"
    server_version = "sparkdeploy-lab-hub"

    def log_message(self, fmt: str, *args: Any) -> None:  # access log on stderr: `docker logs` of the hub container
        sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

    # -- answers ----------------------------------------------------------------------------------------
    def _send(self, code: int, body: bytes = b"", headers: dict[str, Any] | None = None, head: bool = False) -> None:
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _json(self, data: Any, head: bool = False, extra: dict[str, Any] | None = None) -> None:
        self._send(200, json.dumps(data).encode(), dict({"Content-Type": "application/json"}, **(extra or {})), head)

    def _error(self, code: int, error_code: str, message: str, head: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(
            code,
            body,
            {"Content-Type": "application/json", "X-Error-Code": error_code, "X-Error-Message": message},
            head,
        )

    def _allowed(self, meta: dict[str, Any], head: bool) -> bool:
        if not meta.get("gated"):
            return True
        auth = self.headers.get("Authorization", "")
        if self.hub.token and auth == f"Bearer {self.hub.token}":
            return True
        self._error(
            401,
            "GatedRepo",
            f"Access to model {meta['id']} is restricted: you must be authenticated "
            "with a token that was granted access",
            head,
        )
        return False

    def _lookup(self, org: str, name: str, rev: str, head: bool) -> tuple[dict[str, Any], str] | None:
        meta = self.hub.repo(org, name)
        if meta is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}", head)
            return None
        if not self._allowed(meta, head):
            return None
        rev = unquote(rev)
        commit = meta["revisions"].get(rev) or (rev if rev == meta["sha"] else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None
        return meta, commit

    # -- routes -----------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        with self.hub.lock:
            self.hub.stats["requests"] += 1
        path = urlsplit(self.path).path
        if path == "/_lab/stats":
            with self.hub.lock:
                return self._json(self.hub.stats, head)
        m = API_RE.fullmatch(path)
        if m:
            org, name, kind, rev, _sub = m.groups()
            found = self._lookup(org, name, rev or "main", head)
            if found is None:
                return None
            meta, commit = found
            if kind == "tree":
                return self._json([_tree_entry(f) for f in meta["files"]], head)
            return self._json(
                {
                    "id": meta["id"],
                    "modelId": meta["id"],
                    "sha": commit,
                    "private": False,
                    "gated": "manual" if meta.get("gated") else False,
                    "disabled": False,
                    "downloads": 0,
                    "likes": 0,
                    "tags": [],
                    "library_name": "transformers",
                    "siblings": [{"rfilename": f["path"]} for f in meta["files"]],
                },
                head,
            )
        m = RESOLVE_RE.fullmatch(path)
        if m:
            org, name, rev, file_path = m.groups()
            found = self._lookup(org, name, rev, head)
            if found is None:
                return None
            return self._file(found[0], found[1], unquote(file_path), head)
        return self._error(404, "EntryNotFound", f"no route {path}", head)

    def _file(self, meta: dict[str, Any], commit: str, path: str, head: bool) -> None:
        entry = next((f for f in meta["files"] if f["path"] == path), None)
        if entry is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist in {meta['id']}@{commit}", head)
        size = entry["size"]
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{entry["oid"]}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if entry.get("lfs"):
            headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Size"] = str(size)
        start, end = 0, size - 1
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        code = 200
        if rng:
            start = int(rng.group(1))
            end = min(int(rng.group(2)), size - 1) if rng.group(2) else size - 1
            if start >= size:
                return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head)
            code = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if head:
            return None
        sent = 0
        try:
            with open(os.path.join(meta["dir"], path), "rb") as fh:
                fh.seek(start)
                left = end - start + 1
                while left > 0:
                    data = fh.read(min(CHUNK, left))
                    if not data:
                        break
                    self.wfile.write(data)
                    sent += len(data)
                    left -= len(data)
        finally:
            self.hub.count(meta["id"], path, sent)
        return None


def _tree_entry(f: dict[str, Any]) -> dict[str, Any]:
    entry = {"type": "file", "path": f["path"], "size": f["size"], "oid": f["oid"]}
    if f.get("lfs"):
        entry["lfs"] = {"oid": f["lfs"]["oid"], "size": f["size"], "pointerSize": f["lfs"]["pointerSize"]}
    return entry


def serve(root: str, port: int, token: str = "", host: str = "0.0.0.0") -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"hub": Hub(root, token)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str]) -> int:
    root, port = argv[0], int(argv[1])
    token = ""
    if len(argv) > 2 and os.path.isfile(argv[2]):
        with open(argv[2]) as fh:
            token = fh.read().strip()
    server = serve(root, port, token)
    sys.stderr.write(f"lab hub serving {root} on :{port}\n")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
