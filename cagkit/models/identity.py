"""What identifies a model: its `fingerprint`, which a store records for the model that wrote it.

Apart from `loading` (which gives every loaded model its fingerprint) and `registry` (which records a converted
model's), so that neither imports the other.
"""

from __future__ import annotations

import hashlib
import json


def fingerprint(model) -> str:
    """A short id of a model's config and weights: equal models agree, a different checkpoint does not.

    Hashes the architecture fields of the config and, for every tensor, its name, shape and a strided sample of
    its values; cheap (milliseconds) yet sensitive to any retraining or re-quantisation.
    """
    import torch

    cfg = model.config.to_dict()
    keep = {
        k: cfg.get(k)
        for k in ("model_type", "num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size", "vocab_size")
    }
    digest = hashlib.sha256(json.dumps(keep, sort_keys=True).encode())
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 256)][:256].to(torch.float32).cpu()
            digest.update(f"{name}{tuple(tensor.shape)}".encode())
            digest.update(sample.numpy().round(5).tobytes())
    return digest.hexdigest()[:16]
