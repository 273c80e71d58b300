"""Run inside the stack gateway's container (tests/deploy/test_stack_lab.py copies it there): the real hook's
ClientErrors in front of a stand-in for LiteLLM's router that answers 400 "Invalid model name", as it does for
a request admitted while its model was routed when another request of the worker reloaded routes.json without
it (a race no test can time). Prints [status, message] for a model gone, one out, one still routed."""

import asyncio
import json
import sys
from typing import Any

sys.path.insert(0, "/sparkdeploy")
import gateway_hook as g  # the hook beside the gateway's config, found through the path above

ERROR = json.dumps({"error": {"message": "Invalid model name passed in model=x"}}).encode()
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/chat/completions",
    "client": ("1.2.3.4", 1),
    "headers": [(b"content-type", b"application/json")],
}


async def router(scope: dict, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 400, "headers": [(b"content-length", b"%d" % len(ERROR))]})
    await send({"type": "http.response.body", "body": ERROR})


async def ask(model: str) -> list:
    sent: list[dict] = []
    body = json.dumps({"model": model, "messages": []}).encode()
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return requests.pop(0) if requests else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await g.ClientErrors(router)(dict(SCOPE), receive, send)
    return [sent[0]["status"], json.loads(sent[1]["body"])["error"]["message"]]


async def main() -> None:
    g._served, g._unavailable = {"here"}, {"out": "deployment x is out of the gateway: why"}
    print(json.dumps([await ask(model) for model in ("gone", "out", "here")]))


asyncio.run(main())
