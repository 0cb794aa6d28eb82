"""Where a model runs: choosing a device, finding a loaded model's device, waiting for queued GPU work.
"""

from __future__ import annotations

import torch


def model_device(model) -> torch.device:
    """The device of a model's weights: where its inputs (and the KV placed into its cache) must be (the CPU for
    a model without parameters)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so a wall-clock reading after it counts that work (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
