"""The research harness: what the scripts in benchmarks/ measure, apart from the runtime.

cagkit never imports it. It builds on cagkit's public names only; the scripts in benchmarks/ are thin command
lines over it (load models, run, write results files). tests/lab/ and the diagnostics tests of
tests/translate/test_translators.py test it with tiny or no models.

- `heldout`: diagnostic contexts for `cagkit.translate.train.heldout.evaluate_translator` (layer swaps, native
  keys or values, the cross-chunk repair), for benchmarks/kv_swap.py, layer_damage.py and heldout_repair.py.
- `routing`: the Mixture-of-Translators router ablations of benchmarks/routing.py.
- `long_context`: the token stream, cut points and summary of benchmarks/ttft.py.
- `multi_agent`: the agents, discussion protocol, vote and memory accounting of benchmarks/multi_agent.py.
- `synthetic`: documents of random chunks, no model, for benchmarks/lance_race.py and s3_reads.py.
"""
