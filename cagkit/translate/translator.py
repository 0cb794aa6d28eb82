"""Translate a source model's RoPE-free KV cache into a target model's cache space.

A translator maps, for every target layer, aligned source KV features to the target's keys (RoPE removed) and
values. Three kinds share one file format and one `translate` path:

- `mot` (default): Mixture-of-Translators. Per target layer a small MLP trunk reads the source K/V of a window
  of source layers matched by depth plus the target's own token identity (input embeddings of the aligned
  target token and the one before it), and a token-level router sends each token to its top-k of several
  expert MLPs. A low-rank linear skip from the source window carries what every token needs; it starts as the
  (rank-truncated) ridge solution and the experts start at zero, so training begins at the `linear` baseline.
  The trunk reads the skip's compressed source window (its first factor) next to the token identity.
- `projector`: the same trunk with one expert MLP and no router (baseline).
- `linear`: one ridge-regression map per target layer from the source window alone (baseline, closed form).

Injection depth: the target's bottom layer is not translated. Its keys and values depend on each token alone
(embedding -> norm -> projection, no attention), so `translate` computes them exactly from the target's own
weights at table-lookup cost; every layer above it is translated. Recomputing more layers natively would mean
running the target's attention over the chunk, i.e. part of the prefill cagkit exists to skip; the measured
trade-off is in each translator's card (`injection_depth`).

Checkpoints are `translators/<source>__<target>.safetensors` (baselines `<source>__<target>.<kind>.safetensors`),
weights in fp16 with the config and both model fingerprints in the safetensors metadata, and a JSON card next
to each with how it was trained and what it measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from cagkit.config import TRANSLATOR_KINDS as KINDS
from cagkit.config import TRANSLATOR_SIZES
from cagkit.errors import TranslatorError
from cagkit.files import save_safetensors
from cagkit.kv.chunk import ChunkKV
from cagkit.models.device import model_device
from cagkit.translate.alignment import align
from cagkit.translate.cards import read_card, train_command, translator_path, write_card

FORMAT_VERSION = 1
# sizes of designs that lost and were removed (docs/translators.md), each at the value that left it unused
_REMOVED_SIZES = {"token_window": 1, "expert_inputs": "trunk", "focus_layers": [], "focus_scale": 1}


@dataclass
class TranslatorConfig:
    """Shapes of both models and the translator's own sizes; stored in every checkpoint."""

    kind: str
    source_layers: int
    source_kv_dim: int  # source KV heads * head dim (one of K or V)
    target_layers: int
    target_heads: int
    target_head_dim: int
    target_embed_dim: int
    # the translator's own sizes; their defaults and meaning: `cagkit.config.TranslatorSizes`
    native_layers: int = TRANSLATOR_SIZES.native_layers
    window: int = TRANSLATOR_SIZES.window
    width: int = TRANSLATOR_SIZES.width
    expert_hidden: int = TRANSLATOR_SIZES.expert_hidden
    num_experts: int = TRANSLATOR_SIZES.num_experts
    top_k: int = TRANSLATOR_SIZES.top_k
    token_dim: int = TRANSLATOR_SIZES.token_dim
    skip_rank: int = TRANSLATOR_SIZES.skip_rank
    align_mode: str = TRANSLATOR_SIZES.align_mode

    @property
    def target_kv_dim(self) -> int:
        return self.target_heads * self.target_head_dim

    @property
    def translated_layers(self) -> list[int]:
        return list(range(self.native_layers, self.target_layers))

    def source_window(self, target_layer: int) -> list[int]:
        """The `window` source layers nearest in relative depth to `target_layer`."""
        centre = round(target_layer * (self.source_layers - 1) / max(self.target_layers - 1, 1))
        first = min(max(centre - self.window // 2, 0), self.source_layers - self.window)
        return list(range(max(first, 0), min(first + self.window, self.source_layers)))

    @classmethod
    def check_sizes(cls, kind: str, sizes: dict) -> None:
        """Refuse a kind or sizes no translator can have, or sizes `kind` would ignore; needs no model."""
        if kind not in KINDS:
            raise TranslatorError(f"unknown translator kind '{kind}'; use one of {', '.join(KINDS)}")
        for name in ("window", "width", "expert_hidden", "num_experts", "top_k"):
            if name in sizes and int(sizes[name]) < 1:
                raise TranslatorError(f"translator {name.replace('_', ' ')} {sizes[name]} must be 1 or more")
        if kind != "mot" and ("num_experts" in sizes or "top_k" in sizes):
            raise TranslatorError(f"a {kind} translator has no experts to choose from; the number of experts and "
                                  f"top-k are for --kind mot")
        if kind == "linear" and (ignored := [name for name in ("width", "expert_hidden") if name in sizes]):
            flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
            raise TranslatorError(f"a linear translator is one ridge map per layer, with no trunk or experts to "
                                  f"size: {flags} would change nothing; leave it out or use --kind projector or mot")
        if sizes.get("top_k", cls.top_k) > sizes.get("num_experts", cls.num_experts):
            raise TranslatorError(f"top-k {sizes.get('top_k', cls.top_k)} is more than the "
                                  f"{sizes.get('num_experts', cls.num_experts)} experts; give a top-k of at most "
                                  f"the number of experts")

    @classmethod
    def for_models(cls, kind: str, source, target, **sizes) -> "TranslatorConfig":
        """A config for a source and target model (anything with `.config`, e.g. `LoadedModel`)."""
        cls.check_sizes(kind, sizes)
        s_cfg, t_cfg = _text_config(source), _text_config(target)
        sizes["window"] = min(sizes.get("window", cls.window), s_cfg.num_hidden_layers)
        source_dim = sizes["window"] * 2 * s_cfg.num_key_value_heads * _head_dim(s_cfg)
        target_dim = 2 * t_cfg.num_key_value_heads * _head_dim(t_cfg)
        sizes["skip_rank"] = min(sizes.get("skip_rank", cls.skip_rank), source_dim, target_dim)
        if kind == "projector":
            sizes = {"num_experts": 1, "top_k": 1, "expert_hidden": 2 * cls.expert_hidden, **sizes}
        return cls(
            kind=kind,
            source_layers=s_cfg.num_hidden_layers,
            source_kv_dim=s_cfg.num_key_value_heads * _head_dim(s_cfg),
            target_layers=t_cfg.num_hidden_layers,
            target_heads=t_cfg.num_key_value_heads,
            target_head_dim=_head_dim(t_cfg),
            target_embed_dim=t_cfg.hidden_size,
            **sizes,
        )


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


class LayerTranslator(nn.Module):
    """One target layer: features [N, F_in] -> normalised target K and V [N, 2 * Ht * Dt], plus a balance loss.

    The first `source_dim` features are the source window, the rest token identity. `linear` is one affine map
    of the source window. `mot` and `projector` compress the window to rank r (`skip[0]`), map that linearly to
    the output (`skip[1]`), and add the router-weighted sum of the top-k expert MLPs over a trunk that reads
    the compressed window and the tokens (`projector`: one expert, always chosen).
    """

    # Run every expert on every token (True), only on the tokens routed to it (False), or the first on a GPU and
    # the second on the CPU (None). The result is the same up to rounding.
    dense_experts: bool | None = None

    def __init__(self, cfg: TranslatorConfig, source_dim: int, in_dim: int):
        super().__init__()
        out_dim = 2 * cfg.target_kv_dim
        width, expert_hidden = cfg.width, cfg.expert_hidden
        self.kind, self.top_k, self.source_dim = cfg.kind, cfg.top_k, source_dim
        if cfg.kind == "linear":
            self.head = nn.Linear(source_dim, out_dim)
            return
        self.skip = nn.Sequential(nn.Linear(source_dim, cfg.skip_rank, bias=False), nn.Linear(cfg.skip_rank, out_dim))
        trunk_in = cfg.skip_rank + in_dim - source_dim
        self.trunk = nn.Sequential(nn.Linear(trunk_in, width), nn.LayerNorm(width), nn.GELU())
        self.router = nn.Linear(width, cfg.num_experts) if cfg.num_experts > 1 else None
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, expert_hidden), nn.GELU(), nn.Linear(expert_hidden, out_dim))
            for _ in range(cfg.num_experts)
        )
        for expert in self.experts:  # experts start silent: the translator starts as its skip
            nn.init.zeros_(expert[-1].weight)
            nn.init.zeros_(expert[-1].bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [N, F_in] -> y: [N, 2 * Ht * Dt]
        if self.kind == "linear":
            return self.head(x), x.new_zeros(())
        compressed = self.skip[0](x[:, : self.source_dim])  # [N, r]
        y = self.skip[1](compressed)  # [N, 2 * Ht * Dt]
        h = self.trunk(torch.cat([compressed, x[:, self.source_dim:]], dim=-1))  # [N, width]
        if self.router is None:
            return y + self.experts[0](h), x.new_zeros(())
        probs, top_i, gates = self.route(h)
        if self.dense_experts if self.dense_experts is not None else x.is_cuda:
            # Every expert over every row, unchosen ones weighted 0: more arithmetic, but no per-expert row lists,
            # whose sizes the GPU would have to report back to the host before each expert could run.
            weights = torch.zeros_like(probs).scatter(1, top_i, gates)  # [N, E]
            for e, expert in enumerate(self.experts):
                y = y + weights[:, e, None] * expert(h)
        else:
            for e, expert in enumerate(self.experts):
                rows, slot = (top_i == e).nonzero(as_tuple=True)
                if rows.numel():
                    y = y.index_add(0, rows, gates[rows, slot, None] * expert(h[rows]))
        # Switch-style balance: fraction of assignments per expert times its mean probability, 1.0 when uniform
        share = torch.bincount(top_i.reshape(-1), minlength=len(self.experts)).float() / top_i.numel()
        balance = len(self.experts) * (share * probs.mean(dim=0)).sum()
        return y, balance

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The router's choice for each row of the trunk output h [N, width]: its probabilities over the experts
        [N, E], the chosen experts [N, k] and their gates [N, k] (the chosen probabilities renormalised)."""
        probs = torch.softmax(self.router(h), dim=-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        return probs, top_i, top_p / top_p.sum(dim=-1, keepdim=True)


class TranslatorNet(nn.Module):
    """All translated target layers, with the normalisation statistics fitted on the training data.

    forward(source [B, T, Ls, 2 * Fs] raw aligned source K|V, tokens [B, T, 2 * Et]) ->
    (prediction [B, T, Lx, 2 * Ft] normalised, balance loss); `denormalise` maps to raw target K|V.
    """

    def __init__(self, cfg: TranslatorConfig):
        super().__init__()
        self.cfg = cfg
        layers = cfg.translated_layers
        self.register_buffer("source_mean", torch.zeros(cfg.source_layers, 2 * cfg.source_kv_dim))
        self.register_buffer("source_std", torch.ones(cfg.source_layers, 2 * cfg.source_kv_dim))
        self.register_buffer("target_mean", torch.zeros(len(layers), 2 * cfg.target_kv_dim))
        self.register_buffer("target_std", torch.ones(len(layers), 2 * cfg.target_kv_dim))
        self.register_buffer("windows", torch.tensor([cfg.source_window(t) for t in layers], dtype=torch.long))
        uses_tokens = cfg.kind != "linear"
        self.token_proj = nn.Linear(2 * cfg.target_embed_dim, cfg.token_dim) if uses_tokens else None
        source_dim = cfg.window * 2 * cfg.source_kv_dim
        in_dim = source_dim + (cfg.token_dim if uses_tokens else 0)
        self.layers = nn.ModuleList(LayerTranslator(cfg, source_dim, in_dim) for _ in layers)

    def source_inputs(self, source: torch.Tensor) -> list[torch.Tensor]:
        """Per translated layer, its normalised source-window features [N, window * 2Fs] (N = B * T) from the raw
        aligned source K|V [B, T, Ls, 2Fs]."""
        return list(self._source_inputs(source))

    def _source_inputs(self, source: torch.Tensor) -> Iterator[torch.Tensor]:
        """`source_inputs` one layer at a time, so each layer's features can be freed before the next are made."""
        z = (source - self.source_mean).div_(self.source_std)  # [B, T, Ls, 2Fs]
        z = z.reshape(-1, *z.shape[2:])  # [N, Ls, 2Fs]
        for window in self.windows:
            yield z[:, window].reshape(z.shape[0], -1)

    def layer_inputs(self, source: torch.Tensor, tokens: torch.Tensor | None) -> Iterator[torch.Tensor]:
        """Per translated layer in turn, its input features [N, F_in]: the source window, then token identity."""
        if self.token_proj is None:
            yield from self._source_inputs(source)
            return
        tok = self.token_proj(tokens.reshape(-1, tokens.shape[-1]))  # [N, token_dim]
        for x in self._source_inputs(source):
            yield torch.cat([x, tok], dim=-1)

    def forward(self, source: torch.Tensor, tokens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, steps = source.shape[:2]
        outs, balance = [], source.new_zeros(())
        for layer, x in zip(self.layers, self.layer_inputs(source, tokens)):
            y, b = layer(x)
            outs.append(y)
            balance = balance + b / len(self.layers)
        pred = torch.stack(outs, dim=1)  # [N, Lx, 2Ft]
        return pred.reshape(batch, steps, *pred.shape[1:]), balance

    def denormalise(self, pred: torch.Tensor) -> torch.Tensor:
        return pred * self.target_std + self.target_mean

    def normalise_target(self, kv: torch.Tensor) -> torch.Tensor:
        return (kv - self.target_mean) / self.target_std


def source_features(source_kv: ChunkKV, weights: torch.Tensor) -> torch.Tensor:
    """Source K|V gathered at target tokens. weights: [Tt, Ts] from `align` -> [Tt, Ls, 2 * Hs * Ds] float32.

    The weights are sparse (one source token per target token with `cover`, a few with `overlap`), so the
    weighted sum runs over their nonzero entries only: a gather, not a dense [Tt, Ts] product.
    """
    keys, values = source_kv.keys.float(), source_kv.values.float()  # [Ls, Ts, Hs, Ds]
    kv = torch.cat([keys.flatten(2), values.flatten(2)], dim=-1).transpose(0, 1)  # [Ts, Ls, 2F]
    rows, cols = weights.nonzero(as_tuple=True)
    gathered = kv[cols] * weights[rows, cols][:, None, None]  # [nnz, Ls, 2F]; exact for cover's weights of 1
    return torch.zeros(len(weights), *kv.shape[1:], device=kv.device).index_add_(0, rows, gathered)


def token_features(target_model, ids: torch.Tensor) -> torch.Tensor:
    """Unit-normalised target input embeddings of each token and the one before it. ids: [..., T] -> [..., T, 2E]."""
    table = target_model.get_input_embeddings().weight
    emb = nn.functional.normalize(table[ids].detach().float(), dim=-1)  # [..., T, E]
    prev = torch.cat([torch.zeros_like(emb[..., :1, :]), emb[..., :-1, :]], dim=-2)
    return torch.cat([emb, prev], dim=-1)


@torch.no_grad()
def embedding_layer_kv(target_model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's exact RoPE-free layer-0 keys and values, which depend on each token alone.

    ids: [T] -> keys, values [T, H, D]. Uses the model's own modules (embedding scale, input norm, projection
    biases and any key/value norm come from the model), so it equals a native prefill's layer 0.
    """
    decoder = target_model.get_decoder()
    layer = decoder.layers[0]
    attn = layer.self_attn
    h = layer.input_layernorm(target_model.get_input_embeddings()(ids[None]))  # [1, T, E]
    head_dim = attn.head_dim
    keys = attn.k_proj(h).view(len(ids), -1, head_dim)  # [T, H, D]
    values = attn.v_proj(h).view(len(ids), -1, head_dim)
    if hasattr(attn, "k_norm"):
        keys = attn.k_norm(keys)
    if hasattr(attn, "v_norm"):
        values = attn.v_norm(values)
    return keys.float(), values.float()


class Translator:
    """A trained translator for one (source, target) pair; `translate` turns a source chunk into target KV."""

    def __init__(self, net: TranslatorNet, source_fingerprint: str, target_fingerprint: str, card: dict):
        self.net = net.eval()
        self.cfg = net.cfg
        self.kind = net.cfg.kind
        self.source_fingerprint = source_fingerprint
        self.target_fingerprint = target_fingerprint
        self.card = card

    @torch.no_grad()
    def translate(
        self,
        source_kv: ChunkKV,
        source_token_ids: list[int],
        source_offsets: torch.Tensor,
        text: str,
        target,
    ) -> tuple[ChunkKV, list[int]]:
        """Target-space RoPE-free KV [Lt, Tt, Ht, Dt] of `text` as the target tokenizes it, and those token ids.

        source_kv: the source chunk's KV [Ls, Ts, Hs, Ds] (any float dtype, any device); source_offsets: [Ts, 2]
        char spans of its tokens in `text`. Layer 0 is computed exactly from the target's embeddings, the rest
        translated. The result lives on the target model's device.
        """
        return self.translate_many([(source_kv, source_token_ids, source_offsets, text)], target)[0]

    @torch.no_grad()
    def translate_many(self, chunks: list[tuple], target) -> list[tuple[ChunkKV, list[int]]]:
        """`translate` for several chunks, each `(source_kv, source_token_ids, source_offsets, text)`, in one pass
        of the network. A token reads only its own chunk (with a token window, the tokens before it in that chunk), so
        this gives what one call per chunk gives, with a fraction of the kernel launches: on a GPU those, not the
        arithmetic, are most of the time."""
        if target.fingerprint != self.target_fingerprint:
            raise TranslatorError(
                f"translator trained for target fingerprint {self.target_fingerprint} got model '{target.name}' "
                f"with fingerprint {target.fingerprint}; load the translator for this model with load_translator"
            )
        device = model_device(target.model)
        if self.net.source_mean.device != device:  # `.to` walks every module even when nothing moves
            self.net.to(device)
        cfg = self.cfg
        all_ids, sources, tokens = [], [], []
        for source_kv, source_token_ids, source_offsets, text in chunks:
            source_offsets = torch.as_tensor(source_offsets, dtype=torch.long).reshape(-1, 2)
            if not (source_kv.num_tokens == len(source_token_ids) == len(source_offsets)):
                raise TranslatorError(
                    f"source chunk has {source_kv.num_tokens} KV tokens, {len(source_token_ids)} token ids and "
                    f"{len(source_offsets)} offsets; they must agree (was the store built with another tokenizer?)"
                )
            enc = target.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = torch.tensor(enc["input_ids"], dtype=torch.long, device=device)  # [Tt]
            all_ids.append(ids)
            if len(ids) == 0:
                continue
            target_offsets = torch.tensor(enc["offset_mapping"])
            weights = align(source_offsets, target_offsets, cfg.align_mode).to(device)  # [Tt, Ts]
            on_device = ChunkKV(source_kv.keys.to(device), source_kv.values.to(device))
            sources.append(source_features(on_device, weights))  # [Tt, Ls, 2Fs]
            tokens.append(token_features(target.model, ids))  # [Tt, 2E]
        lengths = [len(ids) for ids in all_ids]
        keys = torch.zeros(cfg.target_layers, sum(lengths), cfg.target_heads, cfg.target_head_dim, device=device)
        values = torch.zeros_like(keys)
        if sources:
            pred, _ = self.net(torch.cat(sources)[None], torch.cat(tokens)[None])
            kv = self.net.denormalise(pred)[0].transpose(0, 1)  # [T, Lx, 2Ft] -> [Lx, T, 2Ft]
            shape = (len(cfg.translated_layers), sum(lengths), cfg.target_heads, cfg.target_head_dim)
            keys[cfg.native_layers:] = kv[..., : cfg.target_kv_dim].reshape(shape)
            values[cfg.native_layers:] = kv[..., cfg.target_kv_dim:].reshape(shape)
            if cfg.native_layers:  # layer 0 depends on each token alone: all chunks at once
                keys[0], values[0] = embedding_layer_kv(target.model, torch.cat(all_ids))
        return [(ChunkKV(k, v), ids.tolist())
                for k, v, ids in zip(keys.split(lengths, dim=1), values.split(lengths, dim=1), all_ids)]

    def save(self, path: Path, card: dict | None = None) -> Path:
        """Write the checkpoint (fp16 weights, fp32 statistics) and its JSON card, each atomically."""
        card = card if card is not None else self.card
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {
            name: (t.half() if t.is_floating_point() and not name.endswith(("_mean", "_std")) else t).contiguous()
            for name, t in self.net.state_dict().items()
        }
        metadata = {
            "format_version": str(FORMAT_VERSION),
            "config": json.dumps(asdict(self.cfg)),
            "source_fingerprint": self.source_fingerprint,
            "target_fingerprint": self.target_fingerprint,
        }
        save_safetensors(tensors, path, metadata=metadata)
        write_card(path, card)
        self.card = card
        return path


def read_translator(path: Path) -> Translator:
    """Load a checkpoint file as it is, without checking which models it is for."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise TranslatorError(
            f"translator {path} has format version {meta.get('format_version')}, this cagkit reads "
            f"{FORMAT_VERSION}; retrain it with `cagkit translators train`"
        )
    config = json.loads(meta["config"])
    for name, unused in _REMOVED_SIZES.items():  # recorded by checkpoints saved while they existed
        if config.get(name, unused) == unused or (name == "focus_scale" and not config.get("focus_layers")):
            config.pop(name, None)
    if unknown := sorted(set(config) - {field.name for field in fields(TranslatorConfig)}):
        raise TranslatorError(f"translator {path} was trained with a design since removed ({', '.join(unknown)}; "
                              f"docs/translators.md says which commit last had it); retrain it with "
                              f"`cagkit translators train`")
    with torch.device("meta"):  # no random initialisation of weights the checkpoint replaces at once
        net = TranslatorNet(TranslatorConfig(**config))
    # strict: a tensor missing from the file is an error, so none is left on the meta device
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, assign=True)
    card = read_card(path, "restore it from git, or retrain the translator with `cagkit translators train`")
    return Translator(net, meta["source_fingerprint"], meta["target_fingerprint"], card)


@lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int) -> Translator:
    """`read_translator`, once per file version: every question would otherwise re-read the checkpoint."""
    return read_translator(Path(path))


def load_translator(source_name: str, source_fingerprint: str, target, kind: str = "mot") -> Translator:
    """The `kind` translator from `source_name` to the loaded `target`, checked against both fingerprints."""
    path = translator_path(source_name, target.name, kind)
    if not path.exists():
        raise TranslatorError(
            f"no {kind} translator from '{source_name}' to '{target.name}': {path} does not exist; train one with "
            f"`{train_command(source_name, target.name, kind)}`"
        )
    translator = _read_cached(str(path), path.stat().st_mtime_ns)
    for role, expected, actual, name in (
        ("source", translator.source_fingerprint, source_fingerprint, source_name),
        ("target", translator.target_fingerprint, target.fingerprint, target.name),
    ):
        if expected != actual:
            raise TranslatorError(
                f"translator {path} was trained for {role} model fingerprint {expected}, but '{name}' has "
                f"fingerprint {actual}; retrain it with `{train_command(source_name, target.name, kind)}` "
                f"(or rebuild the store with the model the translator was trained for)"
            )
    return translator
