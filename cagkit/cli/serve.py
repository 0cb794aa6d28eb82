"""`cagkit serve`: an OpenAI-compatible HTTP server over the store, models kept loaded (`cagkit.serve`)."""

from __future__ import annotations

import os

from cagkit.cli.options import add_device_options, add_store_option
from cagkit.config import DEFAULT_MODEL
from cagkit.errors import CagkitError

# the packages the `serve` extra brings; an ImportError naming one of them means the extra is missing
_SERVE_PACKAGES = ("fastapi", "uvicorn", "starlette", "pydantic", "anyio")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="answer over HTTP with an OpenAI-compatible API, models kept loaded",
                       description="Serve POST /v1/chat/completions, /v1/completions, /v1/retrieve and /v1/ingest, "
                                   "GET /v1/models, /v1/jobs/ID, /health and /metrics (see docs/serve.md). Needs "
                                   "the serve extra: pip install 'cagkit[serve]'.")
    add_store_option(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 127.0.0.1 answers this machine only, 0.0.0.0 every network the "
                        "machine is on (then give --api-key) (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument("--models", default=DEFAULT_MODEL, metavar="NAME,...",
                   help="comma-separated models that requests may name (aliases, Hugging Face ids or model "
                        "directories); the first --max-loaded load at start (default: %(default)s)")
    p.add_argument("--max-loaded", type=int, default=2, metavar="N",
                   help="most models in memory at once; a request for another unloads the least recently used "
                        "(default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("CAGKIT_API_KEY") or None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every /v1 request (default: $CAGKIT_API_KEY, "
                        "else none; the variable keeps the key out of the process list)")
    p.add_argument("--cache-bytes", default="2G", metavar="SIZE",
                   help="most memory for placed document contexts kept for the next question on the same "
                        "documents, which then pays only its own prefill; least recently used dropped first; "
                        "e.g. 512M, 4G, 0 to keep none (default: %(default)s)")
    add_device_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from cagkit.serve.settings import ServeConfig, parse_bytes

    config = ServeConfig(store=args.store, host=args.host, port=args.port,
                         models=tuple(m.strip() for m in args.models.split(",")), max_loaded=args.max_loaded,
                         api_key=args.api_key, device=args.device, cache_bytes=parse_bytes(args.cache_bytes))
    config.check()
    try:
        from cagkit.serve.app import serve
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in _SERVE_PACKAGES:
            raise CagkitError(f"cagkit serve needs FastAPI and uvicorn ({exc.name} is missing); install them "
                              f"with: pip install 'cagkit[serve]'") from None
        raise
    serve(config)
    return 0
