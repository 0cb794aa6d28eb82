"""The closed-form parts of training: normalisation statistics and the per-layer ridge regression.

Both read the data one shard at a time and accumulate in float64, so memory does not grow with the data. A
`linear` translator is the ridge solution; `mot` and `projector` start from it (their linear skip is its best
low-rank factorisation), so training begins at the `linear` baseline.
"""

from __future__ import annotations

import torch

from cagkit.translate.train.data import TrainingData
from cagkit.translate.translator import TranslatorNet


def _parts(data):
    """The shards of `data` (`TrainingData`), or `data` itself when it is one dict of stacked fields."""
    return data.parts() if isinstance(data, TrainingData) else [data]


def fit_statistics(net: TranslatorNet, data) -> None:
    """Per-channel mean and std of the source features and the translated layers' target K|V, accumulated
    shard by shard in float64."""
    sums: dict[str, tuple] = {}
    for part in _parts(data):
        src = part["source"].double()
        tgt = part["target_kv"][:, :, net.cfg.native_layers:].double()
        for name, x in (("source", src.reshape(-1, *src.shape[2:])), ("target", tgt.reshape(-1, *tgt.shape[2:]))):
            n, total, squares = sums.get(name, (0, 0.0, 0.0))  # x: [N, L, F]
            sums[name] = (n + len(x), total + x.sum(0), squares + x.pow(2).sum(0))
    for name, (n, total, squares) in sums.items():
        mean = total / n
        std = ((squares - n * mean.pow(2)).clamp(min=0) / max(n - 1, 1)).sqrt()
        getattr(net, f"{name}_mean").copy_(mean.float())
        getattr(net, f"{name}_std").copy_(std.float().clamp(min=1e-4))


@torch.no_grad()
def fit_ridge(net: TranslatorNet, data, ridge: float) -> dict:
    """Closed-form ridge regression per layer from normalised source-window features to normalised K|V.

    The normal equations are accumulated shard by shard (`data`: `TrainingData`, or one dict of stacked
    fields). A `linear` translator takes the solution as is; `mot` and `projector` take its best
    rank-`skip_rank` factorisation (truncated SVD) as their linear skip. Returns the training MSE of the map as
    set, per layer and averaged (normalised units).
    """
    layers = len(net.layers)
    grams, cross, norms, count = [0.0] * layers, [0.0] * layers, [0.0] * layers, 0
    for part in _parts(data):
        target = net.normalise_target(part["target_kv"][:, :, net.cfg.native_layers:].float())  # [B, P, Lx, 2Ft]
        target = target.reshape(-1, *target.shape[2:]).double()  # [N, Lx, 2Ft]
        for i, x in enumerate(net.source_inputs(part["source"].float())):
            x1 = torch.cat([x, torch.ones(len(x), 1)], dim=1).double()  # [N, F + 1]
            grams[i] = grams[i] + x1.T @ x1
            cross[i] = cross[i] + x1.T @ target[:, i]
            norms[i] = norms[i] + float(target[:, i].pow(2).sum())
        count += len(target)
    errors = []
    for i, layer in enumerate(net.layers):
        gram = grams[i] + ridge * torch.eye(grams[i].shape[0], dtype=torch.double)
        gram[-1, -1] -= ridge  # the bias is not shrunk
        w = torch.linalg.solve(gram, cross[i])  # [F + 1, 2Ft]
        if net.cfg.kind == "linear":
            layer.head.weight.copy_(w[:-1].T.float())
            layer.head.bias.copy_(w[-1].float())
        else:
            u, s, vh = torch.linalg.svd(w[:-1], full_matrices=False)  # [F, r'], [r'], [r', 2Ft]
            r = net.cfg.skip_rank
            root = s[:r].sqrt()
            layer.skip[0].weight.copy_((u[:, :r] * root).T.float())  # [r, F]
            layer.skip[1].weight.copy_((vh[:r].T * root).float())  # [2Ft, r]
            layer.skip[1].bias.copy_(w[-1].float())
            w = torch.cat([u[:, :r] @ torch.diag(s[:r]) @ vh[:r], w[-1:]])
        # |X w - Y|^2 from the accumulated sums: w'X'Xw - 2 w'X'Y + |Y|^2
        squared = float((w * (grams[i] @ w)).sum() - 2 * (w * cross[i]).sum()) + norms[i]
        errors.append(max(squared, 0.0) / (count * w.shape[1]))
    return {"kv_mse_per_layer": errors, "kv": sum(errors) / len(errors)}
