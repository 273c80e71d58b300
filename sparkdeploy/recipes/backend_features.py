"""Which `vllm serve` serving flags each cluster backend's HTTP server honours (issue 18).

solo, 2xsolo and the ray and native cluster backends run `vllm serve` itself: its OpenAI server honours
every flag vLLM accepts. The torchrun backend cannot: vLLM's external_launcher works only with the offline
engine, so the HTTP server is the launcher's (images/launcher/sparklaunch), which honours the flags in
TORCHRUN_HONOURS (tool calling and reasoning through sparklaunch.chat; in a real vLLM image with vLLM's own
parsers) and nothing else of vLLM's front-end group. A front-end flag the launcher does not honour is
refused here, at render time (`recipes lint`, `run-recipe --dry-run`, `up`), naming the flag and the
backend, instead of being silently ignored on the Spark.

FRONTEND_FLAGS is vLLM 0.32's front-end group (vllm/entrypoints/launchers/cli_args.py, BaseFrontendArgs
and FrontendArgs) plus the parser flags that live elsewhere; engine flags go to vLLM's engine under every
backend and are checked against the pinned parser by images/vllm_cli.check_args.
"""

from __future__ import annotations

from sparkdeploy.errors import ConfigError, Problem

FRONTEND_FLAGS = frozenset(
    {
        "--lora-modules",
        "--chat-template",
        "--chat-template-content-format",
        "--trust-request-chat-template",
        "--trust-request-mm-kwargs",
        "--default-chat-template-kwargs",
        "--response-role",
        "--return-tokens-as-token-ids",
        "--enable-auto-tool-choice",
        "--exclude-tools-when-tool-choice-none",
        "--tool-call-parser",
        "--tool-parser-plugin",
        "--tool-strict-level",
        "--tool-server",
        "--max-log-len",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        "--enable-server-load-tracking",
        "--enable-force-include-usage",
        "--sse-keep-alive-interval",
        "--enable-tokenizer-info-endpoint",
        "--enable-log-outputs",
        "--enable-log-deltas",
        "--cohere-is-reasoning-model",
        "--cohere-format",
        "--anthropic-disabled-thinking-effort",
        "--log-error-stack",
        "--tokens-only",
        "--enable-scale-out",
        "--fingerprint-mode",
        "--fingerprint-value",
        "--host",
        "--port",
        "--grpc-port",
        "--uds",
        "--uvicorn-log-level",
        "--disable-uvicorn-access-log",
        "--disable-access-log-for-endpoints",
        "--allow-credentials",
        "--allowed-origins",
        "--allowed-methods",
        "--allowed-headers",
        "--api-key",
        "--ssl-keyfile",
        "--ssl-certfile",
        "--ssl-ca-certs",
        "--enable-ssl-refresh",
        "--ssl-cert-reqs",
        "--ssl-ciphers",
        "--root-path",
        "--middleware",
        "--enable-request-id-headers",
        "--disable-fastapi-docs",
        "--enable-offline-docs",
        "--reasoning-parser",
        "--reasoning-parser-plugin",
        "--api-server-count",
        "--enable-log-requests",
    }
)
# what sparklaunch's server does with them: listen, check the key, tools and reasoning (sparklaunch.chat)
TORCHRUN_HONOURS = frozenset(
    {"--host", "--port", "--api-key", "--enable-auto-tool-choice", "--tool-call-parser", "--reasoning-parser"}
)
HONOURED = {"ray": None, "native": None, "torchrun": TORCHRUN_HONOURS}  # None: every flag (vllm serve itself)


def _flags(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def refused_flags(args: list[str], backend: str | None) -> list[str]:
    """The front-end flags in a rendered `vllm serve` argv that this backend's server would not honour."""
    honoured = HONOURED.get(backend or "")
    if honoured is None:
        return []
    return [f for f in dict.fromkeys(_flags(args)) if f in FRONTEND_FLAGS and f not in honoured]


def problems(args: list[str], backend: str | None, recipe_file: str) -> list[Problem]:
    return [
        Problem(
            recipe_file,
            "vllm.extra_args",
            f"{flag} is not honoured by the {backend} backend (its HTTP server is the serving launcher, "
            f"which would ignore it)",
            f"use --backend ray or native, or drop {flag}",
        )
        for flag in refused_flags(args, backend)
    ]


def check_backend_flags(args: list[str], backend: str | None, recipe_file: str) -> None:
    """Raise one problem per refused flag (called where the backend's argv is rendered)."""
    found = problems(args, backend, recipe_file)
    if found:
        raise ConfigError(found)


def serving_backends(extra_args: list[str], candidates: tuple[str, ...] = ("torchrun", "ray", "native")) -> list[str]:
    """The cluster backends that honour every serving flag a recipe passes (for `advise`)."""
    return [b for b in candidates if not refused_flags(list(extra_args), b)]
