"""What runs ON a node for `models`: status, verify, send, receive. Standard library only (the node's python3).

Run as `models CMD ...` of this package's archive (ship.argv); nothing secret is in its arguments. The hub
cache layout is the one huggingface_hub and vLLM read: HF_HOME/hub/models--ORG--NAME/{blobs,snapshots/COMMIT,
refs/REV}. A blob's name is its digest (sha256 of the content for LFS files, the git blob id otherwise),
which is what makes every file checkable on every node. sparkdeploy's own record sits beside the hub cache,
never inside it: HF_HOME/sparkdeploy-models/models--ORG--NAME/COMMIT.json (the manifest: the hub's file list,
written last, so a model without one is not complete) and verified.json (size+mtime+inode of blobs already
hashed, so `up` re-hashes only files that changed since).

Commands (HF_CACHE may start with ~):
  status HF_CACHE [REPO] [--verify]   JSON: per repo/commit, each file ok|missing|size|digest, + free bytes
  have HF_CACHE REPO                  JSON: complete blobs and partial sizes (what a sender can skip)
  finish HF_CACHE                     stdin: a manifest; verify every file, then record the manifest
  send HF_CACHE REPO REQUEST          REQUEST: {"manifest":..., "want":[[blob, offset], ...], "follow": bool};
                                      stdout: the stream
  receive HF_CACHE REPO               stdin: the stream; each blob into a partial file, verified, renamed
  arriving HF_CACHE REPO on|off       mark that bytes of REPO are arriving on this node (a download or a copy)

Forwarding while receiving (`send` with "follow"): while this node's ARRIVING mark exists, a blob that is not
complete yet is read from the file it is being written to (huggingface_hub's BLOB.incomplete, or our own
BLOB.sparkdeploy-partial) as it grows: both are renamed to BLOB when done, so the open file stays the same.
The next node thus receives the model while this one downloads it; it still checks every digest itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any, Protocol

PARTIAL = ".sparkdeploy-partial"
INCOMPLETE = ".incomplete"  # huggingface_hub's partial download of a blob
ARRIVING = "arriving"  # in the record folder: bytes of this model are still arriving on this node
STALL_S = 300  # a followed file that has not grown for this long: the download or copy feeding it is gone
CHUNK = 1 << 20


class Hash(Protocol):
    """A hashlib hash (sha256 or sha1), fed as the bytes come."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def home(hf_cache: str) -> str:
    return os.path.expanduser(hf_cache)


def folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def repo_dir(hf_cache: str, repo: str) -> str:
    return os.path.join(home(hf_cache), "hub", folder(repo))


def record_dir(hf_cache: str, repo: str) -> str:
    return os.path.join(home(hf_cache), "sparkdeploy-models", folder(repo))


def new_hash(blob: str, size: int) -> Hash:
    """sha256 for a 64-hex blob name (LFS), git blob sha1 (its header includes the size) for a 40-hex one."""
    return hashlib.sha256() if len(blob) == 64 else hashlib.sha1(b"blob %d\0" % size)


def digest_of(path: str, blob: str) -> str:
    h = new_hash(blob, os.path.getsize(path))
    with open(path, "rb") as fh:
        for data in iter(lambda: fh.read(CHUNK), b""):
            h.update(data)
    return h.hexdigest()


def _write_json(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + PARTIAL
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_json(path: str, default: Any) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def check_file(blobs: str, f: dict[str, Any], cache: dict[str, list[int]], force: bool) -> str:
    """'ok' | 'missing' | 'size' | 'digest' for one manifest entry; `cache` (verified.json) is updated."""
    path = os.path.join(blobs, f["blob"])
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    if st.st_size != f["size"]:
        return "size"
    if not force and cache.get(f["blob"]) == _stamp(st):
        return "ok"
    if digest_of(path, f["blob"]) != f["blob"]:
        cache.pop(f["blob"], None)
        return "digest"
    cache[f["blob"]] = _stamp(os.stat(path))
    return "ok"


def verify(
    hf_cache: str, manifest: dict[str, Any], force: bool = False, fresh: dict[str, list[int]] | None = None
) -> dict[str, str]:
    """{path: problem} for the files of `manifest` that do not verify; `fresh`: blobs just hashed (stamps)."""
    repo = manifest["repo"]
    blobs = os.path.join(repo_dir(hf_cache, repo), "blobs")
    snap = os.path.join(repo_dir(hf_cache, repo), "snapshots", manifest["commit"])
    cache_path = os.path.join(record_dir(hf_cache, repo), "verified.json")
    cache: dict[str, list[int]] = _read_json(cache_path, {})
    cache.update(fresh or {})
    bad: dict[str, str] = {}
    for f in manifest["files"]:
        state = check_file(blobs, f, cache, force)
        if state == "ok" and not os.path.exists(os.path.join(snap, f["path"])):
            state = "missing"
        if state != "ok":
            bad[f["path"]] = state
    try:
        _write_json(cache_path, cache)
    except OSError:
        pass
    return bad


def free_bytes(hf_cache: str) -> int:
    path = home(hf_cache)
    while not os.path.exists(path):
        path = os.path.dirname(path) or "/"
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def cmd_status(hf_cache: str, repo: str | None = None, force: bool = False) -> dict[str, Any]:
    base = os.path.join(home(hf_cache), "sparkdeploy-models")
    out: dict[str, Any] = {"free": free_bytes(hf_cache), "models": []}
    folders = [folder(repo)] if repo else (sorted(os.listdir(base)) if os.path.isdir(base) else [])
    for name in folders:
        rdir = os.path.join(base, name)
        if not os.path.isdir(rdir):
            continue
        for entry in sorted(os.listdir(rdir)):
            if not entry.endswith(".json") or entry == "verified.json" or entry.endswith(PARTIAL):
                continue
            manifest = _read_json(os.path.join(rdir, entry), None)
            if not manifest:
                continue
            bad = verify(hf_cache, manifest, force)
            out["models"].append(
                {
                    "repo": manifest["repo"],
                    "commit": manifest["commit"],
                    "revision": manifest.get("revision", ""),
                    "size": manifest["total"],
                    "files": len(manifest["files"]),
                    "bad": bad,
                }
            )
    return out


def cmd_have(hf_cache: str, repo: str) -> dict[str, Any]:
    blobs = os.path.join(repo_dir(hf_cache, repo), "blobs")
    have: dict[str, int] = {}
    partial: dict[str, int] = {}
    if os.path.isdir(blobs):
        for name in os.listdir(blobs):
            size = os.path.getsize(os.path.join(blobs, name))
            if name.endswith(PARTIAL):
                partial[name[: -len(PARTIAL)]] = size
            elif name.endswith(".incomplete"):  # huggingface_hub's own partial download
                partial[name[: -len(".incomplete")]] = size
            elif "." not in name:
                have[name] = size
    return {"have": have, "partial": partial, "free": free_bytes(hf_cache)}


def link_snapshot(hf_cache: str, manifest: dict[str, Any]) -> None:
    """snapshots/COMMIT/PATH -> ../../blobs/BLOB (relative, as huggingface_hub makes them) and refs/REV."""
    rdir = repo_dir(hf_cache, manifest["repo"])
    for f in manifest["files"]:
        link = os.path.join(rdir, "snapshots", manifest["commit"], f["path"])
        os.makedirs(os.path.dirname(link), exist_ok=True)
        target = os.path.relpath(os.path.join(rdir, "blobs", f["blob"]), os.path.dirname(link))
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        tmp = link + PARTIAL
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, link)
    revision = manifest.get("revision") or ""
    if revision and revision != manifest["commit"]:
        ref = os.path.join(rdir, "refs", revision)
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        tmp = ref + PARTIAL
        with open(tmp, "w") as fh:
            fh.write(manifest["commit"])
        os.replace(tmp, ref)


def cmd_finish(hf_cache: str, manifest: dict[str, Any], fresh: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """After a download or a copy: every file verified, then the manifest recorded (the 'complete' mark).
    `fresh`: blobs the receiver hashed as they arrived (not hashed twice); every other blob is hashed now."""
    os.makedirs(os.path.join(repo_dir(hf_cache, manifest["repo"]), "blobs"), exist_ok=True)
    link_snapshot(hf_cache, manifest)
    if fresh is None:
        bad = verify(hf_cache, manifest, force=True)
    else:
        cache_path = os.path.join(record_dir(hf_cache, manifest["repo"]), "verified.json")
        _write_json(cache_path, fresh)  # only what was hashed just now counts: the rest is hashed below
        bad = verify(hf_cache, manifest)
    if bad:
        return {"ok": False, "bad": bad}
    _write_json(os.path.join(record_dir(hf_cache, manifest["repo"]), manifest["commit"] + ".json"), manifest)
    return {"ok": True, "bad": {}}


def cmd_arriving(hf_cache: str, repo: str, state: str) -> None:
    mark = os.path.join(record_dir(hf_cache, repo), ARRIVING)
    if state == "on":
        os.makedirs(os.path.dirname(mark), exist_ok=True)
        with open(mark, "w"):
            pass
    elif os.path.exists(mark):
        os.unlink(mark)


def _open_blob(blobs: str, blob: str, arriving: Callable[[], bool]) -> IO[bytes] | None:
    """The blob's file, complete or (while bytes arrive here) the one it is being written to; None if none yet."""
    names = (blob, blob + INCOMPLETE, blob + PARTIAL) if arriving() else (blob,)
    for name in names:
        try:
            return open(os.path.join(blobs, name), "rb")
        except FileNotFoundError:
            continue
    return None


def cmd_send(hf_cache: str, repo: str, request: dict[str, Any]) -> None:
    """A stream of [header line][bytes]...: the manifest, then each wanted blob from its offset. The bytes go
    with sendfile (kernel to pipe, no copy through Python). With "follow", blobs still arriving on this node
    are sent as they are written (see the module's note)."""
    out = sys.stdout.buffer
    blobs = os.path.join(repo_dir(hf_cache, repo), "blobs")
    mark = os.path.join(record_dir(hf_cache, repo), ARRIVING)
    arriving: Callable[[], bool] = (lambda: os.path.exists(mark)) if request.get("follow") else (lambda: False)
    sizes = {f["blob"]: f["size"] for f in request["manifest"]["files"]}
    out.write((json.dumps({"manifest": request["manifest"]}) + "\n").encode())
    for blob, offset in request["want"]:
        size = sizes[blob]
        out.write((json.dumps({"blob": blob, "offset": offset, "size": size}) + "\n").encode())
        out.flush()
        fh: IO[bytes] | None = None
        pos, grew = offset, time.monotonic()
        try:
            while pos < size:
                fh = fh or _open_blob(blobs, blob, arriving)
                sent = os.sendfile(1, fh.fileno(), pos, min(size - pos, 1 << 30)) if fh else 0
                if sent:
                    pos, grew = pos + sent, time.monotonic()
                    continue
                if not arriving() and fh is not None and os.fstat(fh.fileno()).st_size <= pos:
                    raise SystemExit(
                        f"{blob}: this node has {pos} of its {size} bytes and none are arriving "
                        "(the download or copy here stopped); run the pull again"
                    )
                if not arriving() and fh is None:
                    raise SystemExit(f"{blob}: not on this node and not arriving; run the pull again")
                if time.monotonic() - grew > STALL_S:
                    raise SystemExit(f"{blob}: no new bytes for {STALL_S} s at {pos} of {size}; run the pull again")
                time.sleep(0.05)
        finally:
            if fh:
                fh.close()
    out.write(b'{"end": true}\n')
    out.flush()


def cmd_receive(hf_cache: str, repo: str) -> int:
    inp = sys.stdin.buffer
    blobs = os.path.join(repo_dir(hf_cache, repo), "blobs")
    os.makedirs(blobs, exist_ok=True)
    manifest: dict[str, Any] | None = None
    fresh: dict[str, list[int]] = {}
    while True:
        line = inp.readline()
        if not line:
            raise SystemExit(
                "the stream ended early (the sending node or the link went away); run the pull again to resume"
            )
        head = json.loads(line)
        if "manifest" in head:
            manifest = head["manifest"]
            continue
        if head.get("end"):
            break
        blob, offset, size = head["blob"], head["offset"], head["size"]
        if "/" in blob or blob.startswith("."):
            raise SystemExit(f"refusing blob name {blob!r}")
        partial = os.path.join(blobs, blob + PARTIAL)
        h = new_hash(blob, size)
        with open(partial, "ab+") as fh:
            fh.truncate(offset)  # never trust bytes past what the sender resumes from
            fh.seek(0)
            # the lambda runs only inside this loop, while `offset` is this blob's
            for data in iter(lambda: fh.read(min(CHUNK, offset - fh.tell())) if fh.tell() < offset else b"", b""):  # noqa: B023
                h.update(data)  # the part kept from a cut copy: hashed once, not sent again
            fh.seek(offset)
            left = size - offset
            while left > 0:
                data = inp.read(min(CHUNK, left))
                if not data:
                    fh.flush()
                    raise SystemExit(
                        f"the stream ended inside {blob} ({size - left} of {size} bytes kept for "
                        "resume); run the pull again"
                    )
                fh.write(data)
                h.update(data)  # hashed as it arrives: the file is never read back
                left -= len(data)
            fh.flush()
            os.fsync(fh.fileno())
        if h.hexdigest() != blob:
            os.unlink(partial)
            raise SystemExit(f"{blob}: content does not match its digest after the copy (removed); run again")
        os.replace(partial, os.path.join(blobs, blob))
        fresh[blob] = _stamp(os.stat(os.path.join(blobs, blob)))
    if manifest is None:
        raise SystemExit("no manifest in the stream")
    result = cmd_finish(hf_cache, manifest, fresh)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def main(argv: list[str]) -> int:
    cmd, hf_cache, rest = argv[0], argv[1], argv[2:]
    if cmd == "status":
        force = "--verify" in rest
        rest = [a for a in rest if a != "--verify"]
        print(json.dumps(cmd_status(hf_cache, rest[0] if rest else None, force)))
    elif cmd == "have":
        print(json.dumps(cmd_have(hf_cache, rest[0])))
    elif cmd == "finish":
        result = cmd_finish(hf_cache, json.loads(sys.stdin.read()))
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    elif cmd == "send":
        cmd_send(hf_cache, rest[0], json.loads(rest[1]))
    elif cmd == "receive":
        return cmd_receive(hf_cache, rest[0])
    elif cmd == "arriving":
        cmd_arriving(hf_cache, rest[0], rest[1])
    else:
        raise SystemExit(f"unknown command {cmd}")
    return 0
