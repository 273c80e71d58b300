"""The SGLang stand-in's multi-node rendezvous (images/vllm-sim/sglang/launch_server.py): a worker rank stays
joined for as long as rank 0 lives, whatever timeout its connect had (issue 38: the worker of a lab cluster died
5 s after joining, the connect's timeout ending its wait, and the node-side watcher restarted the group)."""

from __future__ import annotations

import argparse
import socket
import threading
import time

import pytest
from sglang import launch_server


def test_a_worker_rank_waits_for_rank_0_past_its_connect_timeout(monkeypatch):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    real_connect = socket.create_connection
    # the connect timeout made short: a wait that honours it would end in 0.2 s, not when rank 0 goes away
    monkeypatch.setattr(launch_server.socket, "create_connection", lambda addr, timeout=None: real_connect(addr, 0.2))

    def rank_0() -> None:
        conn, _ = listener.accept()
        time.sleep(1.0)  # rank 0 serves for a second, then goes away
        conn.close()

    threading.Thread(target=rank_0, daemon=True).start()
    ns = argparse.Namespace(dist_init_addr=f"127.0.0.1:{port}", nnodes=2, node_rank=1)
    started = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        launch_server._rendezvous(ns)
    assert "rank 0 went away" in str(exc.value) and time.monotonic() - started >= 0.9
    listener.close()
