"""Test helpers for tests/bench: a tiny offline tokenizer, a prompt corpus, and a minimal OpenAI-compatible
streaming server (enough for llama-benchy: /v1/models and streamed /v1/chat/completions with usage). The server
is a stand-in for the runner's mechanics only; the real engine stand-in is vllm-sim (see test_sim_e2e.py)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jumping zebras "
    "and every sentence of this corpus is made of plain lowercase words"
).split()


def write_corpus(path: Path, n_words: int = 6000) -> Path:
    path.write_text(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(n_words)) + "\n")
    return path


def write_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for w in WORDS + ["hello", "warmup", "Warmup", "."]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


class FakeOpenAI:
    def __init__(self, model: str = "test/model", api_key: str | None = None, token_delay_s: float = 0.001):
        self.model, self.api_key, self.token_delay_s = model, api_key, token_delay_s
        self.auth_seen: list[str | None] = []
        self.requests = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):  # quiet
                pass

            def _auth_ok(self) -> bool:
                got = self.headers.get("Authorization")
                fake.auth_seen.append(got)
                if fake.api_key and got != f"Bearer {fake.api_key}":
                    self.send_response(401)
                    self.end_headers()
                    self.wfile.write(b'{"error":"bad key"}')
                    return False
                return True

            def do_GET(self):
                if not self._auth_ok():
                    return
                body = json.dumps({"object": "list", "data": [{"id": fake.model, "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n) or b"{}")
                if not self._auth_ok():
                    return
                fake.requests += 1
                text = " ".join(m.get("content", "") for m in req.get("messages", []))
                prompt_tokens = len(text.split()) + 3
                max_tokens = int(req.get("max_tokens") or 16)
                if not req.get("stream"):
                    body = json.dumps(
                        {
                            "id": "x",
                            "object": "chat.completion",
                            "model": fake.model,
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": "Paris"},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": 1,
                                "total_tokens": prompt_tokens + 1,
                            },
                        }
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()

                def send(obj):
                    self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
                    self.wfile.flush()

                time.sleep(0.005)
                send({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
                for i in range(max_tokens):
                    time.sleep(fake.token_delay_s)
                    send({"choices": [{"index": 0, "delta": {"content": " tok"}, "token_ids": [i]}]})
                send(
                    {
                        "choices": [],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": max_tokens,
                            "total_tokens": prompt_tokens + max_tokens,
                        },
                    }
                )
                self.wfile.write(b"data: [DONE]\n\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
