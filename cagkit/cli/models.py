"""`cagkit models`: the known models, converting some on request (`cagkit.models.registry.describe_models`)."""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the known models: installed, converted, shape, KV bytes per token")
    p.add_argument("--convert", nargs="*", metavar="MODEL", help="convert these models now (first use does it anyway)")
    p.add_argument("--json", action="store_true", help="print the list as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from cagkit.models.registry import convert, describe_models

    for name in args.convert or []:
        print(f"converting {name} …", file=sys.stderr)
        convert(name)
    rows = describe_models()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':<9} {'installed':<9} {'converted':<9} {'params':>8} {'layers':>6} {'kv heads':>8} {'head dim':>8} "
          f"{'KV B/token':>10}  description")
    for r in rows:
        params = f"{r['params'] / 1e6:.0f}M" if "params" in r else "-"
        print(f"{r['model']:<9} {'yes' if r['installed'] else 'no':<9} {'yes' if r['converted'] else 'no':<9} "
              f"{params:>8} {r.get('layers', '-'):>6} {r.get('kv_heads', '-'):>8} {r.get('head_dim', '-'):>8} "
              f"{r.get('kv_bytes_per_token', '-'):>10}  {r['description']}")
    return 0
