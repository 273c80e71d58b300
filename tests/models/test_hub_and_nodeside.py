"""The lab hub server and the node scripts, without the lab: the real server process on localhost, the real
huggingface_hub client (pinned in requirements-test.txt) downloading from it, and the node-side copy and
verification run as the processes they are on a node (the shipped archive: nodeside/ship.py), through a real
pipe."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from sparkdeploy.lab import hub_repo
from sparkdeploy.lab.hub_server import serve
from sparkdeploy.models import ops
from sparkdeploy.models.pull import _to_come
from sparkdeploy.nodeside import ship

TOKEN = "hf_labtesttoken"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    hub_repo.write_repo(root / "lab" / "tiny-model", "lab/tiny-model", (1, 1), False)
    hub_repo.write_repo(root / "lab" / "gated-model", "lab/gated-model", (1,), True)
    server = serve(str(root), 0, TOKEN, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def hub_client(endpoint: str, home: Path, *calls: tuple[str, ...], token: str = "") -> list[dict]:
    """Run nodeside/hub_client.py's commands in ONE process (huggingface_hub imports once): one answer per call; each
    call is (token, cmd, repo, revision) or (cmd, repo, revision)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1")
    driver = (
        "import json, os, sys\nfrom sparkdeploy.nodeside.hub_client import main\n"
        "for call in json.loads(sys.argv[1]):\n"
        "    os.environ.pop('HF_TOKEN', None)\n"
        "    if call[0]: os.environ['HF_TOKEN'] = call[0]\n"
        "    try: main(call[1:])\n"
        "    except SystemExit: pass\n"
        "    sys.stdout.flush()\n"
    )
    norm = [list(c) if len(c) == 4 else [token, *c] for c in calls]
    run = subprocess.run(
        [sys.executable, "-c", driver, json.dumps(norm)], env=env, capture_output=True, text=True, timeout=120
    )
    answers = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(calls), run.stderr[-2000:]
    return answers


def nodeside(*args: str, stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ship.argv("models", *args, python=sys.executable), input=stdin, capture_output=True, timeout=120
    )


def stats(endpoint: str) -> dict:
    with urllib.request.urlopen(endpoint + "/_lab/stats") as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def downloaded(hub, tmp_path_factory):
    """lab/tiny-model downloaded by the real client into a fresh HF_HOME; (home, manifest, bytes the hub sent)."""
    home = tmp_path_factory.mktemp("src")
    before = stats(hub)["repos"].get("lab/tiny-model", {}).get("bytes", 0)
    manifest, got = hub_client(hub, home, ("plan", "lab/tiny-model", "main"), ("download", "lab/tiny-model", "main"))
    assert "path" in got
    manifest["revision"] = "main"
    return home, manifest, stats(hub)["repos"]["lab/tiny-model"]["bytes"] - before


def copy_of(home: Path, tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(home, tmp_path / "copy", symlinks=True)
    return tmp_path / "copy"


def test_real_client_downloads_and_every_file_verifies(downloaded, tmp_path):
    home, manifest, served = downloaded
    tmp_path = copy_of(home, tmp_path)
    assert {f["path"] for f in manifest["files"]} >= {
        "config.json",
        "model-00001-of-00002.safetensors",
        "tokenizer.json",
        "model.safetensors.index.json",
    }
    lfs = [f for f in manifest["files"] if f["lfs"]]
    assert len(lfs) == 2 and all(len(f["blob"]) == 64 for f in lfs)  # sha256 from the hub's LFS metadata
    assert served == manifest["total"]  # the hub served each byte once

    # huggingface_hub named each blob by its etag: what nodeside verifies (sha256 / git blob id)
    done = nodeside("finish", str(tmp_path), stdin=json.dumps(manifest).encode())
    assert json.loads(done.stdout) == {"ok": True, "bad": {}}, done.stderr
    state = json.loads(nodeside("status", str(tmp_path)).stdout)
    assert ops.complete_commit(state, ops.ModelRef("lab/tiny-model", "main"))
    assert (tmp_path / "hub/models--lab--tiny-model/refs/main").read_text() == manifest["commit"]

    # one flipped byte in a weight file: found (the file changed since it was verified), named
    shard = next(f for f in lfs if f["path"].startswith("model-00002"))
    blob = tmp_path / "hub/models--lab--tiny-model/blobs" / shard["blob"]
    with open(blob, "r+b") as fh:
        fh.seek(4096)
        byte = fh.read(1)
        fh.seek(4096)
        fh.write(bytes([byte[0] ^ 0xFF]))
    state = json.loads(nodeside("status", str(tmp_path)).stdout)
    assert state["models"][0]["bad"] == {shard["path"]: "digest"}
    assert ops.complete_commit(state, ops.ModelRef("lab/tiny-model", "main")) is None


def test_bad_input_gets_the_hubs_error_codes(hub, tmp_path):
    answers = hub_client(
        hub,
        tmp_path,
        ("", "plan", "lab/no-such-model", "main"),
        ("", "plan", "lab/tiny-model", "v9.9"),
        ("", "plan", "lab/gated-model", "main"),
        ("hf_wrong", "plan", "lab/gated-model", "main"),
        (TOKEN, "plan", "lab/gated-model", "main"),
    )
    assert [a.get("error") for a in answers] == ["repo", "revision", "gated", "gated", None]
    assert answers[-1]["commit"]


def test_range_requests_resume(hub):
    req = urllib.request.Request(hub + "/lab/tiny-model/resolve/main/config.json", headers={"Range": "bytes=10-"})
    with urllib.request.urlopen(req) as resp:
        assert resp.status == 206 and resp.headers["Content-Range"].startswith("bytes 10-")
        assert resp.headers["X-Repo-Commit"]
    head = urllib.request.Request(hub + "/lab/tiny-model/resolve/main/model-00001-of-00002.safetensors", method="HEAD")
    with urllib.request.urlopen(head) as resp:
        assert len(resp.headers["X-Linked-Etag"].strip('"')) == 64 and int(resp.headers["X-Linked-Size"]) > 1 << 20


def test_copy_cut_midway_resumes_and_never_counts_as_complete(downloaded, tmp_path):
    src, manifest, _ = downloaded
    dst = tmp_path / "dst"
    assert json.loads(nodeside("finish", str(src), stdin=json.dumps(manifest).encode()).stdout)["ok"]

    want = [[f["blob"], 0] for f in manifest["files"]]
    stream = nodeside("send", str(src), "lab/tiny-model", json.dumps({"manifest": manifest, "want": want})).stdout
    assert len(stream) > manifest["total"]
    cut = stream[: len(stream) // 2]  # the link drops halfway
    broken = nodeside("receive", str(dst), "lab/tiny-model", stdin=cut)
    assert broken.returncode != 0 and b"run the pull again" in broken.stderr
    state = json.loads(nodeside("status", str(dst)).stdout)
    assert state["models"] == []  # nothing recorded: not complete
    held = json.loads(nodeside("have", str(dst), "lab/tiny-model").stdout)
    assert held["partial"] and sum(held["partial"].values()) > 0
    left = _to_come(manifest, held)
    assert 0 < left < manifest["total"]

    # the resume sends only what is missing, from each partial file's length
    sizes = {f["blob"]: f["size"] for f in manifest["files"]}
    want = [[b, held["partial"].get(b, 0)] for b, s in sizes.items() if held["have"].get(b) != s]
    again = nodeside("send", str(src), "lab/tiny-model", json.dumps({"manifest": manifest, "want": want})).stdout
    assert len(again) < len(stream) - len(cut) + 4096
    done = nodeside("receive", str(dst), "lab/tiny-model", stdin=again)
    assert done.returncode == 0 and json.loads(done.stdout)["ok"], done.stderr
    state = json.loads(nodeside("status", str(dst), "--verify").stdout)
    assert state["models"][0]["bad"] == {} and state["models"][0]["commit"] == manifest["commit"]
    target = os.readlink(dst / "hub/models--lab--tiny-model/snapshots" / manifest["commit"] / "config.json")
    assert target.startswith("../../blobs/")  # the layout huggingface_hub and vLLM read offline


def test_a_corrupted_stream_is_refused_and_removed(downloaded, tmp_path):
    src, manifest, _ = downloaded
    dst = tmp_path / "dst"
    big = max(manifest["files"], key=lambda f: f["size"])
    stream = bytearray(
        nodeside(
            "send", str(src), "lab/tiny-model", json.dumps({"manifest": manifest, "want": [[big["blob"], 0]]})
        ).stdout
    )
    stream[len(stream) // 2] ^= 0xFF
    bad = nodeside("receive", str(dst), "lab/tiny-model", stdin=bytes(stream))
    assert bad.returncode != 0 and b"does not match its digest" in bad.stderr
    assert not list((dst / "hub/models--lab--tiny-model/blobs").iterdir())


def test_model_ids_and_revisions_are_checked_before_anything_runs():
    from sparkdeploy.errors import ConfigError

    assert ops.model_ref("openai/gpt-oss-120b", None) == ops.ModelRef("openai/gpt-oss-120b", "main")
    for bad in ("gpt-oss", "a/b/c", "../x", "a/$(id)", "-x/y"):
        with pytest.raises(ConfigError):
            ops.model_ref(bad, None)
    with pytest.raises(ConfigError):
        ops.model_ref("a/b", "main; rm -rf /")
    assert (
        ops.pull_command(ops.ModelRef("a/b", "v1"), "inv.yaml")
        == "sparkdeploy models pull a/b --revision v1 --inventory inv.yaml"
    )


def test_what_a_node_still_needs():
    from sparkdeploy.models.pull import wanted

    manifest = {
        "files": [
            {"path": "a", "blob": "x" * 64, "size": 100},
            {"path": "b", "blob": "y" * 40, "size": 10},
            {"path": "c", "blob": "z" * 64, "size": 50},
        ]
    }
    held = {"have": {"y" * 40: 10, "z" * 64: 50}, "partial": {"x" * 64: 30}}
    assert wanted(manifest, held) == {"x" * 64: 30}  # resumes from the partial file's length
    assert wanted(manifest, held, {"c": "digest"}) == {"x" * 64: 30, "z" * 64: 0}  # a bad file comes again
    held = {"have": {}, "partial": {"x" * 64: 100}}  # a partial as long as the file: it failed its digest once
    assert wanted(manifest, held)["x" * 64] == 0


def _writing(
    src: Path, blob: dict, receiving: Path, seen: list, pieces: int = 4, pause: float = 0.15
) -> threading.Thread:
    """A download in progress, as huggingface_hub makes one: BLOB.incomplete grows, then is renamed to BLOB.
    Before the rename it waits (up to 10 s) for bytes at the receiver (`receiving`: its partial file), and notes
    in `seen` whether any came."""
    blobs = src / "hub/models--lab--tiny-model/blobs"
    data = (blobs / blob["blob"]).read_bytes()
    (blobs / blob["blob"]).unlink()
    part = blobs / (blob["blob"] + ".incomplete")

    def write() -> None:
        import time

        step = len(data) // pieces + 1
        with open(part, "wb") as fh:
            for i in range(0, len(data), step):
                time.sleep(pause)
                fh.write(data[i : i + step])
                fh.flush()

        def arrived() -> bool:  # bytes in the receiver's partial file, or already the whole verified blob
            done = receiving.with_name(blob["blob"])
            return done.exists() or (receiving.exists() and receiving.stat().st_size > 0)

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not arrived():
            time.sleep(0.05)
        seen.append(arrived())
        os.replace(part, blobs / blob["blob"])
        nodeside("arriving", str(src), "lab/tiny-model", "off")

    return threading.Thread(target=write, daemon=True)


def test_a_sender_forwards_a_blob_while_it_is_being_downloaded(downloaded, tmp_path):
    """`send` with follow reads a blob from the file huggingface_hub is still writing, through its rename, and
    the receiver gets every byte verified: the next node is fed while this one downloads."""
    src = copy_of(downloaded[0], tmp_path)
    manifest = downloaded[1]
    big = max(manifest["files"], key=lambda f: f["size"])
    nodeside("arriving", str(src), "lab/tiny-model", "on")
    dst, seen = tmp_path / "dst", []
    writer = _writing(
        src, big, dst / "hub/models--lab--tiny-model/blobs" / (big["blob"] + ".sparkdeploy-partial"), seen
    )
    request = json.dumps({"manifest": manifest, "want": [[big["blob"], 0]], "follow": True})
    send = subprocess.Popen(
        ship.argv("models", "send", str(src), "lab/tiny-model", request, python=sys.executable),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    writer.start()
    got = subprocess.run(
        ship.argv("models", "receive", str(dst), "lab/tiny-model", python=sys.executable),
        stdin=send.stdout,
        capture_output=True,
        timeout=60,
    )
    assert send.wait(timeout=60) == 0, send.stderr.read()
    writer.join()
    assert seen == [True], "the receiver got nothing until the download had finished"
    # only the one blob was asked for: the model is not recorded (the rest is missing), but that blob arrived
    # whole, its digest checked by the receiver before it took the blob's name
    bad = json.loads(got.stdout)["bad"]
    assert bad and big["path"] not in bad, got.stdout
    assert (dst / "hub/models--lab--tiny-model/blobs" / big["blob"]).stat().st_size == big["size"]


def test_a_sender_stops_with_one_line_when_its_download_stopped(downloaded, tmp_path):
    src = copy_of(downloaded[0], tmp_path)
    manifest = downloaded[1]
    big = max(manifest["files"], key=lambda f: f["size"])
    blobs = src / "hub/models--lab--tiny-model/blobs"
    data = (blobs / big["blob"]).read_bytes()
    (blobs / big["blob"]).unlink()
    (blobs / (big["blob"] + ".incomplete")).write_bytes(data[: len(data) // 2])  # a download cut, nothing arriving
    request = json.dumps({"manifest": manifest, "want": [[big["blob"], 0]], "follow": True})
    sent = nodeside("send", str(src), "lab/tiny-model", request)
    assert sent.returncode != 0
    assert b"not on this node and not arriving" in sent.stderr  # the half file is not taken for the blob


def test_a_failed_hop_is_named_by_its_cause_not_the_broken_pipe_it_caused():
    from types import SimpleNamespace

    from sparkdeploy.models.pull import _copy_problem

    to = SimpleNamespace(name="spark2")
    full = (
        "OSError: [Errno 28] No space left on device\nTraceback (most recent call last):\n"
        '  File "<string>", line 1, in <module>\nBrokenPipeError: [Errno 32] Broken pipe\n'
    )
    assert (
        _copy_problem(full, to, "~/.cache/huggingface")
        == "spark2's ~/.cache/huggingface is full (No space left on device); free space there"
    )
    cut = (
        "the stream ended inside abc (5 of 9 bytes kept for resume); run the pull again\n"
        "Traceback (most recent call last):\nBrokenPipeError: [Errno 32] Broken pipe\n"
    )
    assert _copy_problem(cut, to, "~/.cache/huggingface").startswith("the stream ended inside abc")
    assert _copy_problem("", to, "x") == ""


def test_a_gguf_repo_added_to_the_lab_hub_is_served_as_lfs_files(tmp_path, monkeypatch):
    """hub_repo.add_repo (issue 38: the llama.cpp lab test's GGUF comes through `models pull`): the files are served
    as a Hub repository, GGUF weights as LFS files (sha256 and size, as the Hub lists a quant); the same files again
    leave the repository as it is."""
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    files = {f"tiny-0000{i}-of-00002.gguf": bytes([i]) * (1000 + i) for i in (1, 2)}
    meta = hub_repo.add_repo("lab/tiny-gguf", files)
    assert hub_repo.add_repo("lab/tiny-gguf", files)["sha"] == meta["sha"]
    server = serve(str(hub_repo.root()), 0, TOKEN, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (plan,) = hub_client(
            f"http://127.0.0.1:{server.server_address[1]}", tmp_path / "home", ("plan", "lab/tiny-gguf", "main")
        )
    finally:
        server.shutdown()
    assert plan["commit"] == meta["sha"], plan
    listed = {f["path"]: f for f in plan["files"]}
    assert set(listed) == set(files), plan
    for path, data in files.items():
        assert listed[path]["lfs"] and listed[path]["size"] == len(data), listed[path]
        assert listed[path]["blob"] == hashlib.sha256(data).hexdigest(), listed[path]
