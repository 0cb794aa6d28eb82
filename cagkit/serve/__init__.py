"""`cagkit serve`: an OpenAI-compatible HTTP server that keeps models loaded over one shared store.

    from cagkit.serve import ServeConfig
    from cagkit.serve.app import create_app, serve

    serve(ServeConfig(store="stores/default", models=("smollm2", "gemma")))  # what `cagkit serve` runs

`settings` (the `ServeConfig`; light, so `cagkit --help` stays quick), `app` (the FastAPI routes, which only
translate between HTTP and the engine), `schemas` (the OpenAI request and response bodies and their checks),
`engine` (the server's state: the queue of answers on the models' threads, cancellation, streaming), `models`
(the loaded-model pool: least recently used unloaded first, one thread per model), `store` (the store as each
thread reads it, reopened after an ingest), `jobs` (background ingest) and `metrics` (Prometheus text). FastAPI
and uvicorn come with the `serve` extra: `pip install 'cagkit[serve]'`.
"""

from cagkit.serve.settings import ServeConfig

__all__ = ["ServeConfig"]
