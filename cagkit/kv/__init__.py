"""A chunk's KV from prefill to the target's cache: capture (`prefill`), RoPE (`rope`), placement (`place`),
the cross-chunk repair (`repair`) and attention over placed KV (`attention`)."""
