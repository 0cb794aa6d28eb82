"""Train translators: paired prefills over a text corpus, the MoT training loop, the ridge baseline, evaluation.

Data. Windows of corpus text are cut so the target tokenizes each into exactly `prefix + continuation` tokens.
The prefix text is prefilled alone by the source (as `cagkit ingest` stores a chunk) and its KV gathered at the
target tokens (`cagkit.alignment`); the target prefills `sink + prefix + continuation` natively once, which gives
its RoPE-free prefix KV (the reconstruction target), its hidden states over the continuation and its top logits
there (the Context Correction targets). In a share of the examples (`recall_fraction`) the continuation is
instead a span copied from the prefix: the target replays it natively by looking it up in the context, which
is what answering a question about a document needs, and the translated keys have to support the same look-up.
With `qa_data`, a share of the examples (`qa_fraction`) instead pair a passage of a question-answering file with
the prompt `cagkit ask` gives the target for one of its questions and that question's answer.
Examples are stored in fp16 shards under the work dir; generation
resumes shard by shard, and training reads them from disk on demand (`TrainingData`).

Objective. KV reconstruction (MSE of normalised K and V per translated layer) + Context Correction Loss: the
frozen target replays the continuation over `sink + translated prefix` and is pulled towards its native replay
(KL over the native top logits, renormalised, or with `full_vocab_kl` over the whole vocabulary as those tokens
plus one bin for the rest; plus relative MSE of every layer's hidden states), with gradients
only into the translator + a load-balancing term that keeps every expert in use.

Held-out files: any `.txt` under a folder named `testing`, and files named `test.txt`, are never trained on;
`evaluate_translator` measures continuation NLL and KL to native over them, for the text that follows each
passage and for a recall continuation (a span of the passage repeated).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import math
import os
import random
import resource
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.config import TrainSettings
from cagkit.errors import TranslatorError
from cagkit.generation import prompt_parts
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefill_kv, sink_ids
from cagkit.kv.repair import blend
from cagkit.kv.rope import RotaryTables, apply_rope, remove_rope
from cagkit.models.loading import LoadedModel, load_model
from cagkit.models.registry import cagkit_home
from cagkit.translate.alignment import align
from cagkit.translate.translator import (
    Translator,
    TranslatorConfig,
    TranslatorNet,
    card_path,
    embedding_layer_kv,
    read_translator,
    source_features,
    token_features,
    translator_path,
    write_card,
)


def corpus_files(corpus: Path, heldout: bool) -> list[Path]:
    """The corpus's `.txt` files for training (`heldout=False`) or held out for evaluation (`heldout=True`)."""
    if not Path(corpus).is_dir():
        raise TranslatorError(f"corpus {corpus} is not a folder; give a folder of .txt files")
    files = []
    for path in sorted(Path(corpus).rglob("*.txt")):
        if path.name.upper() == "SOURCE.TXT" or path.name.upper().startswith("README"):
            continue
        is_heldout = "testing" in path.relative_to(corpus).parts or path.name == "test.txt"
        if is_heldout == heldout:
            files.append(path)
    if not files:
        kind = "held-out" if heldout else "training"
        raise TranslatorError(f"corpus {corpus} has no {kind} .txt files; held-out text goes under a testing/ "
                              f"folder or in files named test.txt, the training text anywhere else")
    return files


def sample_windows(files: list[Path], count: int, seed: int, target: LoadedModel, need: int) -> list[str]:
    """`count` text windows, each starting at a line start, that the target tokenizes into >= `need` tokens."""
    rng = random.Random(seed)
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    sizes = [len(t) for t in texts]
    windows = []
    while len(windows) < count:
        text = rng.choices(texts, weights=sizes)[0]
        start = text.find("\n", rng.randrange(max(len(text) - 8 * need, 1))) + 1
        window = text[start: start + 8 * need]
        if len(window.split()) < need // 2:  # mostly blank: skip
            continue
        if target.count_tokens(window) >= need:
            windows.append(window)
    return windows


@torch.no_grad()
def make_example(source: LoadedModel, target: LoadedModel, window: str, settings: TrainSettings,
                 align_mode: str, tables: tuple[RotaryTables, RotaryTables], recall_at: int | None = None,
                 continuation: list[int] | None = None) -> dict:
    """One paired-prefill training example from a text window (see the module docstring). With `recall_at`,
    the continuation is the prefix's tokens from that index on (a recall continuation) instead of what follows;
    with `continuation` (C token ids), it is those."""
    P, C = settings.prefix_tokens, settings.continuation_tokens
    enc = target.tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"][: P + C]
    if recall_at is not None:
        ids = ids[:P] + recall_continuation(ids[:P], C, recall_at)
    if continuation is not None:
        ids = ids[:P] + list(continuation)
    offsets = torch.tensor(enc["offset_mapping"][:P])  # [P, 2]
    prefix_text = window[: int(offsets[-1, 1])]
    src = source.tokenizer(prefix_text, add_special_tokens=False, return_offsets_mapping=True)
    source_kv = prefill_kv(source.model, src["input_ids"], tables[0])
    features = source_features(source_kv, align(torch.tensor(src["offset_mapping"]), offsets, align_mode))

    sink = sink_ids(target)
    cache = DynamicCache()  # config-less: keeps every layer's full KV
    out = target.model.get_decoder()(
        input_ids=torch.tensor([sink + ids]), cache=cache, use_cache=True, output_hidden_states=True
    )
    s = len(sink)
    positions = torch.arange(s, s + P)
    kv = []
    for layer, cached in enumerate(cache.layers):
        k = cached.keys[0, :, s: s + P].transpose(0, 1)  # [1, H, T, D] -> [P, H, D]
        v = cached.values[0, :, s: s + P].transpose(0, 1)
        cos, sin = tables[1](layer, positions)
        kv.append(torch.cat([remove_rope(k, cos, sin).flatten(1), v.flatten(1)], dim=-1))  # [P, 2Ft]
    hidden = torch.stack(out.hidden_states[1:])[:, 0, s + P:]  # [Lt, C, E]
    logits = _logits(target, out.last_hidden_state[0, s + P:])  # [C, V]
    top = logits.topk(settings.top_logits, dim=-1)
    example = {
        "source": features.half(),  # [P, Ls, 2Fs]
        "target_kv": torch.stack(kv, dim=1).half(),  # [P, Lt, 2Ft]
        "ids": torch.tensor(ids[:P]),
        "continuation": torch.tensor(ids[P:]),
        "hidden": hidden.bfloat16(),  # residual streams exceed the fp16 range (Gemma 3 reaches ~1e5)
        "top_ids": top.indices,
        "top_logits": top.values,
    }
    if settings.full_vocab_kl:
        example["logsumexp"] = logits.float().logsumexp(-1)  # [C], the native log-partition
    return example


def qa_passages(settings: TrainSettings, target: LoadedModel) -> list[tuple[str, str, str]]:
    """(passage window, question, answer) per usable question of `settings.qa_data`: the window starts at the
    line (or, when the answer would fall past the prefix, the sentence) holding the answer's first occurrence,
    so the answer lies within the first `prefix_tokens` target tokens."""
    from cagkit.evaluation.datasets import load_examples

    path, P = Path(settings.qa_data), settings.prefix_tokens
    examples = load_examples(path, settings.qa_format)
    if settings.qa_skip >= len(examples):
        raise TranslatorError(f"--qa-skip {settings.qa_skip} leaves none of the {len(examples)} questions of "
                              f"{path}; give a smaller number")
    held = {doc for example in examples[: settings.qa_skip] for doc in example.context_documents()}
    items = []
    for example in examples[settings.qa_skip:]:
        docs = example.context_documents()
        if any(doc in held for doc in docs):
            continue
        found = next(((doc, doc.find(a), a) for a in example.answers if a.strip() for doc in docs if a in doc), None)
        if found is None:
            continue
        doc, at, answer = found
        sentence = doc.rfind(". ", 0, at)  # -1: no sentence break before the answer, so no sentence start
        starts = [doc.rfind("\n", 0, at) + 1, *([sentence + 2] if sentence >= 0 else []), doc.rfind(" ", 0, at) + 1]
        for start in starts:
            window = doc[start: start + 8 * (P + 16)]
            ends = [end for _, end in target.tokenizer(window, add_special_tokens=False,
                                                       return_offsets_mapping=True)["offset_mapping"]]
            if len(ends) >= P and ends[P - 1] >= at - start + len(answer):
                items.append((window, example.question.strip(), answer.strip()))
                break
    if not items:
        raise TranslatorError(f"{path}: no question whose answer is found in a document of at least "
                              f"{P} target tokens after --qa-skip {settings.qa_skip}; check the file and --qa-format")
    return items


def qa_continuation(target: LoadedModel, question: str, answer: str, length: int) -> tuple[list[int], torch.Tensor]:
    """The target tokens that follow the context when `cagkit ask` puts `question` to `target`, then `answer`'s,
    their last `length` or padded (with end-of-text) to `length`; and the mask of the real ones."""
    if target.chat:  # the chat template's rest of the user turn and the assistant header, then the answer
        ids = prompt_parts(target, question)[1] + target.tokenizer(answer, add_special_tokens=False)["input_ids"]
    else:  # the base-model prompt, "Question: ...\nAnswer:", tokenised with the answer
        ids = target.tokenizer(f"\n\nQuestion: {question}\nAnswer: {answer}", add_special_tokens=False)["input_ids"]
    ids = ids[-length:]  # too long: the start of the prompt's rest goes, the question's end and the answer stay
    pad = target.tokenizer.eos_token_id if target.tokenizer.eos_token_id is not None else 0
    mask = torch.zeros(length, dtype=torch.bool)
    mask[: len(ids)] = True
    return ids + [pad] * (length - len(ids)), mask


def recall_continuation(prefix_ids: list[int], length: int, start: int) -> list[int]:
    """`length` prefix tokens from `start` (clamped so the span fits): a continuation that repeats the context."""
    start = min(max(start, 0), max(len(prefix_ids) - length, 0))
    return list(prefix_ids[start: start + length])


def _logits(target: LoadedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The target's LM head on final hidden states, with its logit soft-capping when the config has one."""
    logits = target.model.get_output_embeddings()(hidden)
    cap = getattr(target.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def generate_data(source: LoadedModel, target: LoadedModel, corpus: Path, settings: TrainSettings,
                  align_mode: str, data_dir: Path, log=print) -> TrainingData:
    """Make (or finish making) the training shards under `data_dir`; returns them as `TrainingData`, read
    from disk on demand."""
    data_dir.mkdir(parents=True, exist_ok=True)
    need = settings.prefix_tokens + settings.continuation_tokens
    files = corpus_files(corpus, heldout=False)
    tables = (RotaryTables(source.model), RotaryTables(target.model))
    shards = math.ceil(settings.examples / settings.shard_size)
    qa_items = None
    for index in range(shards):
        path = data_dir / f"shard_{index:04d}.pt"
        if path.exists():
            continue
        if settings.qa_fraction and qa_items is None:
            qa_items = qa_passages(settings, target)
            log(f"question-answer passages: {len(qa_items)} from {settings.qa_data}")
        started = time.time()
        seed = settings.seed * 100_003 + index
        windows = sample_windows(files, settings.shard_size, seed, target, need)
        rng = random.Random(seed + 1)
        last = max(settings.prefix_tokens - settings.continuation_tokens, 0)
        starts = [rng.randrange(last + 1) if rng.random() < settings.recall_fraction else None for _ in windows]
        qa_rng, examples = random.Random(seed + 2), []  # drawn from only with question-answer continuations
        for window, at in zip(windows, starts):
            if settings.qa_fraction and qa_rng.random() < settings.qa_fraction:
                window, question, answer = qa_rng.choice(qa_items)
                ids, mask = qa_continuation(target, question, answer, settings.continuation_tokens)
                example = {**make_example(source, target, window, settings, align_mode, tables, continuation=ids),
                           "mask": mask}
            else:
                example = make_example(source, target, window, settings, align_mode, tables, at)
                if settings.qa_fraction:  # every example of such a run carries a mask, so the shards stack
                    example["mask"] = torch.ones(settings.continuation_tokens, dtype=torch.bool)
            examples.append(example)
        stacked = {key: torch.stack([e[key] for e in examples]) for key in examples[0]}
        tmp = path.with_suffix(".tmp")
        torch.save(stacked, tmp)
        os.replace(tmp, path)
        log(f"data shard {index + 1}/{shards}: {len(examples)} examples in {time.time() - started:.0f}s")
    return TrainingData([data_dir / f"shard_{i:04d}.pt" for i in range(shards)])


class TrainingData:
    """The examples of a run, left in their shard files and read on demand (memory-mapped): a training step
    reads its batch, the statistics and the ridge fit read one shard at a time, so memory does not grow with
    the amount of training text."""

    def __init__(self, paths: list[Path]):
        self.paths = list(paths)
        shapes = [tuple(part["ids"].shape) for part in self.parts()]  # [n, P] per shard
        self.sizes = [shape[0] for shape in shapes]
        self.starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.tokens = sum(math.prod(shape) for shape in shapes)  # target prefix tokens over all examples

    @staticmethod
    def _open(path: Path) -> dict:
        return torch.load(path, mmap=True, weights_only=True)

    def __len__(self) -> int:
        return sum(self.sizes)

    def parts(self):
        """Each shard's fields ({name: [n, ...]}), one shard at a time."""
        for path in self.paths:
            yield self._open(path)

    def batch(self, indices: torch.Tensor) -> dict:
        """The examples at `indices` (positions over all shards, in that order), each field stacked."""
        rows = []
        for index in indices.tolist():
            shard = bisect.bisect_right(self.starts, index) - 1
            rows.append((shard, index - self.starts[shard]))
        opened = {shard: self._open(self.paths[shard]) for shard in {shard for shard, _ in rows}}
        return {key: torch.stack([opened[shard][key][row] for shard, row in rows])
                for key in opened[rows[0][0]]}

    def all(self) -> dict:
        """Every example in memory, each field stacked: for small data and tests."""
        return self.batch(torch.arange(len(self)))


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


def place_differentiable(target: LoadedModel, cache: DynamicCache, kv: torch.Tensor, cfg: TranslatorConfig,
                         tables: RotaryTables) -> None:
    """Append RoPE-free K|V [B, P, Lt, 2Ft] after `cache`'s contents with the target's RoPE, keeping gradients
    (the differentiable twin of `cagkit.kvcache.place_chunks`)."""
    batch, steps = kv.shape[:2]
    start = cache.get_seq_length()
    positions = torch.arange(start, start + steps)
    for layer in range(cfg.target_layers):
        k = kv[:, :, layer, : cfg.target_kv_dim].reshape(batch, steps, cfg.target_heads, cfg.target_head_dim)
        v = kv[:, :, layer, cfg.target_kv_dim:].reshape(batch, steps, cfg.target_heads, cfg.target_head_dim)
        cos, sin = tables(layer, positions)
        k = apply_rope(k, cos, sin)  # [B, P, H, D]
        cache.update(k.transpose(1, 2), v.transpose(1, 2), layer)  # [B, H, P, D]


def full_target_kv(net: TranslatorNet, target: LoadedModel, pred: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Translated K|V [B, P, Lx, 2Ft] (normalised) plus the exact embedding layers -> raw K|V [B, P, Lt, 2Ft]."""
    raw = net.denormalise(pred)
    if not net.cfg.native_layers:
        return raw
    bottom = []
    for row in ids:
        k, v = embedding_layer_kv(target.model, row)  # [P, H, D]
        bottom.append(torch.cat([k.flatten(1), v.flatten(1)], dim=-1))
    return torch.cat([torch.stack(bottom)[:, :, None], raw], dim=2)


def context_correction(target: LoadedModel, kv: torch.Tensor, batch: dict, cfg: TranslatorConfig,
                       tables: RotaryTables) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL, hidden) of the frozen target replaying the continuation over `sink + translated prefix` vs native.
    The KL is over the whole vocabulary (`top_bins_kl`) when the batch carries the native log-partition, else
    over the native top logits, renormalised."""
    sink = sink_ids(target)
    b = kv.shape[0]
    cache = DynamicCache(config=target.model.config)
    if sink:
        with torch.no_grad():
            target.model.get_decoder()(input_ids=torch.tensor([sink] * b), cache=cache, use_cache=True)
    place_differentiable(target, cache, kv, cfg, tables)
    out = target.model.get_decoder()(
        input_ids=batch["continuation"], cache=cache, use_cache=True, output_hidden_states=True
    )
    hidden = torch.stack(out.hidden_states[1:], dim=1)  # [B, Lt, C, E]
    native = batch["hidden"].float()
    mask = batch["mask"].float() if "mask" in batch else torch.ones(batch["continuation"].shape)  # [B, C]
    weight = mask[:, None, :, None]  # 0 on a question-answer continuation's padding
    # per-channel relative error: a few huge residual channels must not drown the rest
    scale = (native.pow(2) * weight).sum(dim=(0, 2), keepdim=True) / weight.sum(dim=(0, 2), keepdim=True)
    scale = scale + 1e-3 * scale.mean(dim=-1, keepdim=True)  # [1, Lt, 1, E]
    positions = weight.sum() * hidden.shape[1] * hidden.shape[-1]  # real positions x layers x channels
    hidden_loss = ((hidden - native).pow(2) / scale * weight).sum() / positions
    if "logsumexp" in batch:
        kl = top_bins_kl(batch["top_logits"].float(), batch["logsumexp"].float(), batch["top_ids"],
                         _logits(target, out.last_hidden_state), mask)
        return kl, hidden_loss
    rows = target.model.get_output_embeddings().weight[batch["top_ids"]]  # [B, C, K, E]
    logits = torch.einsum("bce,bcke->bck", out.last_hidden_state, rows)
    cap = getattr(target.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    native_logp = torch.log_softmax(batch["top_logits"].float(), dim=-1)
    kl = (native_logp.exp() * (native_logp - torch.log_softmax(logits, dim=-1))).sum(-1)  # [B, C]
    return (kl * mask).sum() / mask.sum(), hidden_loss


def top_bins_kl(native_top: torch.Tensor, native_lse: torch.Tensor, top_ids: torch.Tensor,
                logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over positions (those where `mask` [...] is 1, if given) of KL(native || translated) over K + 1
    bins: the native top-K tokens and one bin for the rest of the vocabulary. `native_top` [..., K] are the
    native logits of `top_ids`, `native_lse` [...] their full log-partition, `logits` [..., V] the translated
    full logits."""
    native_logp = native_top - native_lse.unsqueeze(-1)  # [..., K], exact log-probabilities
    native_rest = torch.log1p(-native_logp.exp().sum(-1).clamp(max=1 - 1e-6))  # log of the mass outside top-K
    lse = logits.logsumexp(-1, keepdim=True)
    logp = logits.gather(-1, top_ids) - lse
    rest = logits.scatter(-1, top_ids, float("-inf")).logsumexp(-1) - lse.squeeze(-1)
    kl = (native_logp.exp() * (native_logp - logp)).sum(-1) + native_rest.exp() * (native_rest - rest)
    return kl.mean() if mask is None else (kl * mask).sum() / mask.sum()


def attention_loss(target: LoadedModel, kv: torch.Tensor, batch: dict, cfg: TranslatorConfig,
                   tables: RotaryTables) -> torch.Tensor:
    """Mean over the translated layers (above layer 0) of KL(native || translated) of the attention that the
    continuation's native queries give the sink and the prefix, with the native prefix keys vs the translated
    keys `kv` (raw RoPE-free K|V [B, P, Lt, 2Ft]). The sink is the same on both sides, so the loss sees how much
    attention goes to the context at all, not only where in it."""
    layers = [layer for layer in cfg.translated_layers if layer > 0]  # layer 0's input is not kept in `hidden`
    sink = sink_ids(target)
    with torch.no_grad():
        sink_keys = prefill_kv(target.model, sink, tables).keys.to(kv.dtype) if sink else None  # [Lt, S, Hk, D]
    total = kv.new_zeros(())
    mask = batch["mask"].to(kv.dtype)[:, None, None, :] if "mask" in batch else None  # [B, 1, 1, C]
    for layer in layers:
        native, translated = prefix_attention(target, [batch["target_kv"].to(kv.dtype), kv], batch["hidden"], layer,
                                              cfg, tables, sink_keys)
        kl = (native.exp() * (native - translated)).sum(-1)  # [B, Hk, G, C]
        total = total + (kl.mean() if mask is None else (kl * mask).sum() / (mask.sum() * kl.shape[1] * kl.shape[2]))
    return total / max(len(layers), 1)


def prefix_attention(target: LoadedModel, kvs: list[torch.Tensor], hidden: torch.Tensor, layer: int,
                     cfg: TranslatorConfig, tables: RotaryTables,
                     sink_keys: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per K|V in `kvs` (raw RoPE-free [B, P, Lt, 2Ft]), the log-attention [B, Hk, G, C, S + P] of the
    continuation's queries in `layer` over the sink keys (RoPE-free [Lt, S, Hk, D], if given) and its prefix
    keys, normalised over those positions. The queries, computed once, come from `hidden` [B, Lt, C, E], each
    layer's output over the continuation (the next layer's input), at the positions the training replay uses:
    sink, prefix, continuation. Gradients flow into the keys only."""
    attn = target.model.get_decoder().layers[layer].self_attn
    b, steps = kvs[0].shape[:2]
    length = hidden.shape[2]
    start = len(sink_ids(target))
    heads, dim = cfg.target_heads, cfg.target_head_dim
    dtype = kvs[0].dtype
    with torch.no_grad():
        x = target.model.get_decoder().layers[layer].input_layernorm(hidden[:, layer - 1].to(dtype))  # [B, C, E]
        q = attn.q_proj(x).view(b, length, -1, dim)  # [B, C, Hq, D]
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q)
        q = apply_rope(q, *tables(layer, torch.arange(start + steps, start + steps + length)))
        q = q.view(b, length, heads, -1, dim) * attn.scaling  # [B, C, Hk, G, D]: query heads grouped by KV head
    first = start - (sink_keys.shape[1] if sink_keys is not None else 0)  # the position of the first key
    cos, sin = tables(layer, torch.arange(first, start + steps))
    cap = getattr(attn, "attn_logit_softcapping", None) or getattr(attn.config, "attn_logit_softcapping", None)
    window = getattr(attn, "sliding_window", None)
    # a sliding-window layer: a query sees the keys less than `window` positions back
    hidden_keys = (torch.arange(start + steps, start + steps + length)[:, None] - torch.arange(first, start + steps)
                   >= window) if window else None  # [C, S + P]
    out = []
    for kv in kvs:
        k = kv[:, :, layer, : cfg.target_kv_dim].reshape(b, steps, heads, dim)
        if sink_keys is not None:
            k = torch.cat([sink_keys[layer][None].expand(b, -1, -1, -1), k], dim=1)  # [B, S + P, Hk, D]
        logits = torch.einsum("bchgd,bphd->bhgcp", q, apply_rope(k, cos, sin))
        if cap:  # Gemma 2 style soft-capping
            logits = torch.tanh(logits / cap) * cap
        if hidden_keys is not None:
            logits = logits.masked_fill(hidden_keys, -1e9)  # a row with nothing in sight stays finite
        out.append(torch.log_softmax(logits, dim=-1))
    return out


def batch_losses(net: TranslatorNet, target: LoadedModel, batch: dict, settings: TrainSettings,
                 tables: RotaryTables) -> dict[str, torch.Tensor]:
    """The weighted training loss of one batch of examples and its parts (kv, kl, hidden, balance, and
    attention when it is weighted)."""
    cfg = net.cfg
    pred, balance = net(batch["source"].float(), token_features(target.model, batch["ids"]))
    kv_loss = (pred - net.normalise_target(batch["target_kv"][:, :, cfg.native_layers:].float())).pow(2).mean()
    full = full_target_kv(net, target, pred, batch["ids"])
    # Without the Context Correction Loss its parts are still measured (the log shows what the KV loss alone
    # does to them), but no graph is kept for a backward pass through the target.
    with contextlib.nullcontext() if settings.kl_weight or settings.hidden_weight else torch.no_grad():
        kl, hidden = context_correction(target, full, batch, cfg, tables)
    loss = (settings.kv_weight * kv_loss + settings.kl_weight * kl + settings.hidden_weight * hidden
            + settings.balance_weight * balance)
    parts = {"kv": kv_loss, "kl": kl, "hidden": hidden, "balance": balance}
    if settings.attention_weight:
        parts["attention"] = attention_loss(target, full, batch, cfg, tables)
        loss = loss + settings.attention_weight * parts["attention"]
    return {"loss": loss, **parts}


def _config_key(cfg: TranslatorConfig, settings: TrainSettings) -> str:
    """A short hash of what a training state depends on, so a resume never loads an incompatible state."""
    ignored = ("steps", "threads", "checkpoint_every", "heldout_examples", "heldout_prefix_tokens", "heldout_seed")
    shaping = {k: v for k, v in asdict(settings).items() if k not in ignored}
    for added_later in ("attention_weight", "full_vocab_kl"):  # states of runs without them keep their key
        if not shaping[added_later]:
            shaping.pop(added_later)
    if not shaping["qa_fraction"]:  # likewise without question-answer continuations
        for name in ("qa_data", "qa_format", "qa_fraction", "qa_skip"):
            shaping.pop(name)
    config = asdict(cfg)
    if config["token_window"] == 1:  # likewise for the token window, added after them
        config.pop("token_window")
    if config["expert_inputs"] == "trunk":  # and for what the experts read, added after that
        config.pop("expert_inputs")
    if not config["focus_layers"]:  # and for focused layers, added after that
        config.pop("focus_layers"), config.pop("focus_scale")
    return hashlib.sha256(json.dumps([config, shaping], sort_keys=True).encode()).hexdigest()[:10]


def _qa_tag(settings: TrainSettings) -> str:
    """The data folder's suffix for question-answer continuations: the file's content, format, share and skip."""
    if not settings.qa_fraction:
        return ""
    digest = hashlib.sha256(Path(settings.qa_data).read_bytes()).hexdigest()[:10]
    return f"-qa{settings.qa_fraction:g}-{digest}-{settings.qa_format or 'auto'}-skip{settings.qa_skip}"


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _lr_at(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(settings.steps - settings.warmup, 1)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train_loop(net: TranslatorNet, target: LoadedModel, data: TrainingData, settings: TrainSettings, state_path: Path,
               log=print) -> dict:
    """Train `net` for `settings.steps`, checkpointing to `state_path` and resuming from it. Returns the state."""
    for p in target.model.parameters():
        p.requires_grad_(False)
    params = [p for p in net.parameters() if p.requires_grad]
    # the ridge-initialised skip is already good: it moves ten times slower than the rest
    skip = [p for name, p in net.named_parameters() if ".skip." in name]
    rest = [p for name, p in net.named_parameters() if ".skip." not in name]
    opt = torch.optim.AdamW([{"params": rest, "scale": 1.0}, {"params": skip, "scale": settings.skip_lr_scale}],
                            lr=settings.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(settings.seed)
    # `running` holds the losses' moving averages (what the log and the card's final losses show); it is kept in
    # the state so a resumed run reports what an uninterrupted one would
    state = {"step": 0, "wall_s": 0.0, "history": [], "running": {}}
    if state_path.exists():
        saved = torch.load(state_path, weights_only=False)
        net.load_state_dict(saved["net"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["generator"])
        state = saved["state"]
        log(f"resumed at step {state['step']}/{settings.steps}")
    tables = RotaryTables(target.model)
    net.train()
    running: dict[str, float] = state.setdefault("running", {})
    while state["step"] < settings.steps:
        started = time.time()
        step = state["step"]
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings) * group["scale"]
        pick = torch.randint(len(data), (settings.batch,), generator=gen)
        parts = batch_losses(net, target, data.batch(pick), settings, tables)
        loss = parts["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for key, value in parts.items():
            running[key] = value.item() if key not in running else 0.95 * running[key] + 0.05 * value.item()
        state["step"] += 1
        state["wall_s"] += time.time() - started
        if state["step"] % 10 == 0 or state["step"] == settings.steps:
            log(f"step {state['step']}/{settings.steps} " + " ".join(f"{k} {v:.4f}" for k, v in running.items())
                + f" | {time.time() - started:.2f}s/step")
        if state["step"] % settings.checkpoint_every == 0 or state["step"] == settings.steps:
            state["history"].append({"step": state["step"], **running})
            _save_atomic({"net": net.state_dict(), "opt": opt.state_dict(), "generator": gen.get_state(),
                          "state": state}, state_path)
    net.eval()
    return state


def _continuation_logp(target: LoadedModel, cache: DynamicCache, continuation: list[int]) -> torch.Tensor:
    """Log-probabilities [C - 1, V] of the target's next-token predictions over continuation[:-1] after `cache`."""
    ids = torch.tensor([continuation])
    out = target.model.get_decoder()(input_ids=ids[:, :-1], cache=cache, use_cache=True)
    return torch.log_softmax(_logits(target, out.last_hidden_state[0]).float(), dim=-1)


@torch.no_grad()
def evaluate_translator(translator: Translator, source: LoadedModel, target: LoadedModel, corpus: Path,
                        settings: TrainSettings, native_bottom: tuple[int, ...] = (), swap_halves: bool = False,
                        repair_ratios: tuple[float, ...] = (),
                        native_layer_sets: dict[str, tuple[int, ...]] | None = None) -> dict:
    """Held-out continuation scores with no context, native context and translated context (through the public
    `translate` path): NLL of the true tokens, recovery = (none - translated) / (none - native), and the fidelity
    to native, KL(native || context) over the full vocabulary (NLL alone can beat native by sharpening, KL
    cannot). `native_bottom` also scores hybrids whose bottom k layers come from a native prefill (the
    injection-depth trade-off), with timings per chunk. `swap_halves` also scores the translated chunk with
    native keys (`native_keys`) and with native values (`native_values`): which half loses the context.
    `repair_ratios` also scores the translated chunk after the cross-chunk repair (`cagkit.blend.blend`, tokens
    chosen by their layer-1 deviation, as `--blend-select deviation` does at ask time) has recomputed that share
    of its tokens (`repaired_R`; 1 is a full prefill by the target). `native_layer_sets` (name -> layer indices)
    also scores, under each name, the translated chunk with those layers' keys and values taken from the native
    prefill: which layers lose the context."""
    P, C = settings.heldout_prefix_tokens, settings.continuation_tokens
    windows = sample_windows(corpus_files(corpus, heldout=True), settings.heldout_examples, settings.heldout_seed + 7,
                             target, P + C)
    sink = sink_ids(target)
    tables = RotaryTables(target.model)
    rng = random.Random(settings.heldout_seed + 11)
    sums: dict[str, dict[str, float]] = {"next": {}, "recall": {}}
    kl_sums: dict[str, dict[str, float]] = {"next": {}, "recall": {}}
    timing = {"translate": 0.0, "target_prefill_decoder": 0.0}
    for window in windows:
        enc = target.tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
        prefix_text = window[: enc["offset_mapping"][P - 1][1]]
        src = source.tokenizer(prefix_text, add_special_tokens=False, return_offsets_mapping=True)
        source_kv = prefill_kv(source.model, src["input_ids"])
        started = time.time()
        translated, ids = translator.translate(source_kv, src["input_ids"], torch.tensor(src["offset_mapping"]),
                                               prefix_text, target)
        timing["translate"] += time.time() - started
        continuations = {"next": enc["input_ids"][P: P + C],
                         "recall": recall_continuation(enc["input_ids"][:P], C, rng.randrange(max(P - C, 0) + 1))}
        started = time.time()  # what a native prefill of the chunk costs: the decoder body, no LM head
        target.model.get_decoder()(input_ids=torch.tensor([sink + ids]), cache=DynamicCache(), use_cache=True)
        timing["target_prefill_decoder"] += time.time() - started
        native = prefill_kv(target.model, sink + ids, tables)
        native = ChunkKV(native.keys[:, len(sink):], native.values[:, len(sink):])
        contexts = {"none": [], "native": [native], "translated": [translated]}
        for k in native_bottom:
            contexts[f"native_bottom_{k}"] = [_with_native_layers(translated, native, range(k))]
        if swap_halves:
            contexts["native_keys"] = [ChunkKV(native.keys, translated.values.to(native.values.dtype))]
            contexts["native_values"] = [ChunkKV(translated.keys.to(native.keys.dtype), native.values)]
        for name, layers in (native_layer_sets or {}).items():
            contexts[name] = [_with_native_layers(translated, native, layers)]
        for ratio in repair_ratios:
            contexts[f"repaired_{ratio:g}"] = blend(target.model, sink, [translated], [ids], ratio, tables)
        for task, continuation in continuations.items():
            logps = {}
            for name, chunks in contexts.items():
                cache = DynamicCache(config=target.model.config)
                if sink:
                    target.model.get_decoder()(input_ids=torch.tensor([sink]), cache=cache, use_cache=True)
                place_chunks(target.model, cache, chunks, tables)
                logps[name] = _continuation_logp(target, cache, continuation)  # [C - 1, V]
            truth = torch.tensor(continuation[1:])[:, None]
            for name, logp in logps.items():
                sums[task][name] = sums[task].get(name, 0.0) + float(-logp.gather(1, truth).mean())
                kl = (logps["native"].exp() * (logps["native"] - logp)).sum(-1).mean()
                kl_sums[task][name] = kl_sums[task].get(name, 0.0) + float(kl)
    n = len(windows)
    result = {
        "heldout_files": [str(p) for p in corpus_files(corpus, heldout=True)],
        "examples": n,
        "prefix_tokens": P,
        "continuation_tokens": C,
        **_scores(sums["next"], kl_sums["next"], n),
        # The same contexts, continued by a span of themselves: how much of the target's recall survives.
        "recall": _scores(sums["recall"], kl_sums["recall"], n),
        "ms_per_chunk": {key: 1000 * value / n for key, value in timing.items()},
    }
    return result


def _with_native_layers(translated: ChunkKV, native: ChunkKV, layers) -> ChunkKV:
    """`translated` with the keys and values of `layers` replaced by the native prefill's."""
    keys, values = translated.keys.to(native.keys.dtype).clone(), translated.values.to(native.values.dtype).clone()
    for layer in layers:
        if not 0 <= layer < keys.shape[0]:
            raise ValueError(f"layer {layer} is outside the target's {keys.shape[0]} layers")
        keys[layer], values[layer] = native.keys[layer], native.values[layer]
    return ChunkKV(keys, values)


def _scores(nll_sums: dict[str, float], kl_sums: dict[str, float], n: int) -> dict:
    """Mean NLL and KL-to-native per context, and their recoveries relative to no context."""
    nll = {name: total / n for name, total in nll_sums.items()}
    kl = {name: total / n for name, total in kl_sums.items()}
    gain = nll["none"] - nll["native"]
    return {
        "nll": nll,
        "recovery": {name: (nll["none"] - value) / gain for name, value in nll.items() if name != "none"},
        "kl_to_native": kl,
        "kl_recovery": {name: 1 - value / kl["none"] for name, value in kl.items() if name != "none"},
    }


def train_translator(source: str, target: str, corpus: Path, steps: int | None = None, out: Path | None = None,
                     kind: str = "mot", work_dir: Path | None = None, settings: TrainSettings | None = None,
                     init: Path | None = None, log=print) -> Path:
    """Train (or resume training) the `kind` translator from `source` to `target` on `corpus`.

    With `init`, training starts from that checkpoint's weights (same pair and shape) instead of the ridge
    initialisation: a fine-tuning run, which its card records.

    Paired-prefill shards and the training state live in `work_dir` (default
    `$CAGKIT_HOME/train/<source>__<target>`), so an interrupted run continues where it stopped. Writes the
    checkpoint (default `translators/<source>__<target>[.<kind>].safetensors`) and its JSON card; returns its path.
    """
    settings = settings or TrainSettings()
    if init and kind == "linear":
        raise TranslatorError("--init continues a trained translator; a linear one is solved in closed form")
    if kind != "linear" and not (settings.kv_weight or settings.kl_weight or settings.hidden_weight):
        raise TranslatorError("the KV loss and the Context Correction Loss are both weighted 0: nothing to train; "
                              "give --kv-weight or --ccl-weight a positive value")
    if settings.prefix_tokens < settings.continuation_tokens:
        raise TranslatorError(f"--prefix-tokens {settings.prefix_tokens} is shorter than the "
                              f"{settings.continuation_tokens}-token continuation a recall example copies from it; "
                              f"give at least {settings.continuation_tokens}")
    if not 0 <= settings.qa_fraction <= 1:
        raise TranslatorError(f"--qa-fraction {settings.qa_fraction} is not a share; give a value from 0 to 1")
    if settings.qa_fraction and not settings.qa_data:
        raise TranslatorError("--qa-fraction needs a question-answering file to take the questions from; pass --qa")
    if settings.qa_data and not Path(settings.qa_data).is_file():
        raise TranslatorError(f"--qa {settings.qa_data}: no such file; give a question-answering file "
                              f"that `cagkit eval --data` reads")
    if settings.qa_skip < 0:
        raise TranslatorError(f"--qa-skip {settings.qa_skip} is negative; give 0 or more questions to leave out")
    if (settings.qa_skip or settings.qa_format) and not settings.qa_fraction:
        raise TranslatorError("--qa-skip and --qa-format shape question-answer continuations; pass --qa FILE "
                              "(and a --qa-fraction above 0) or leave them out")
    TranslatorConfig.check_sizes(kind, settings.sizes)
    for heldout in (False, True):  # both kinds of text must be there before the long work starts
        corpus_files(corpus, heldout)
    if steps is not None:
        settings.steps = steps
    torch.set_num_threads(settings.threads)
    random.seed(settings.seed)
    torch.manual_seed(settings.seed)
    corpus = Path(corpus)
    started = time.time()
    src, tgt = load_model(source, device="cpu"), load_model(target, device="cpu")  # training runs on the CPU
    out = Path(out) if out else translator_path(source, target, kind)
    work_dir = Path(work_dir) if work_dir else cagkit_home() / "train" / f"{source}__{target}"
    cfg = TranslatorConfig.for_models(kind, src, tgt, **settings.sizes)
    recall = f"-r{settings.recall_fraction:g}" if settings.recall_fraction else ""
    data_dir = work_dir / (f"data-{cfg.align_mode}-p{settings.prefix_tokens}c{settings.continuation_tokens}"
                           f"k{settings.top_logits}{'-lse' if settings.full_vocab_kl else ''}{recall}"
                           f"-seed{settings.seed}{_qa_tag(settings)}")
    data = generate_data(src, tgt, corpus, settings, cfg.align_mode, data_dir, log)
    data_s = time.time() - started
    net = TranslatorNet(cfg)
    if kind == "linear":
        fit_started = time.time()
        fit_statistics(net, data)
        final = fit_ridge(net, data, settings.ridge)
        train_s, steps_done = time.time() - fit_started, 0
    else:
        key = _config_key(cfg, settings)
        if init:
            start = read_translator(Path(init))
            if asdict(start.net.cfg) != asdict(cfg) or start.target_fingerprint != tgt.fingerprint:
                raise TranslatorError(f"{init} is not a {kind} translator of this shape for {source} -> {target}; "
                                      f"pass a checkpoint of this pair and kind to --init")
            key += "-init-" + hashlib.sha256(Path(init).read_bytes()).hexdigest()[:10]
        state_path = work_dir / f"{kind}-{key}.state.pt"
        # the statistics and the ridge fit only initialise: a saved state or an --init checkpoint holds its own
        if state_path.exists():
            log(f"statistics and weights come from the saved state {state_path.name}")
        elif init:
            net.load_state_dict(start.net.state_dict())
            log(f"starting from {init} ({start.card.get('steps', '?')} steps)")
        else:
            fit_statistics(net, data)
            ridge_fit = fit_ridge(net, data, settings.ridge)
            log(f"linear skip initialised from ridge: training kv mse {ridge_fit['kv']:.4f}")
        state = train_loop(net, tgt, data, settings, state_path, log)
        final = state["history"][-1] if state["history"] else {}  # none with --steps 0
        train_s, steps_done = state["wall_s"], state["step"]
    translator = Translator(net, src.fingerprint, tgt.fingerprint, {})
    log("evaluating on held-out text ...")
    heldout = evaluate_translator(translator, src, tgt, corpus, settings, native_bottom=(2, tgt.num_layers // 2))
    log(f"held-out NLL {json.dumps(heldout['nll'])} recovery {json.dumps(heldout['recovery'])} "
        f"KL to native {json.dumps(heldout['kl_to_native'])}; recall KL recovery "
        f"{json.dumps(heldout['recall']['kl_recovery'])}")
    card = {
        "kind": kind,
        "source": {"name": source, "fingerprint": src.fingerprint},
        "target": {"name": target, "fingerprint": tgt.fingerprint},
        "corpus": str(corpus),
        "training_examples": len(data),
        "training_tokens": data.tokens,
        "steps": steps_done,
        **({"initialised_from": {"path": str(init), "steps": start.card.get("steps"),
                                 "card_final_losses": start.card.get("final_losses")}} if init else {}),
        "final_losses": final,
        "heldout": heldout,
        "injection_depth": {
            "default": f"layer 0 exact from token embeddings, layers 1..{tgt.num_layers - 1} translated"
            if cfg.native_layers else "all layers translated",
            "native_bottom_k": "heldout['native_bottom_<k>'] scores: bottom k layers from a native target "
                               "prefill (costs about k/L of heldout.ms_per_chunk.target_prefill_decoder)",
        },
        "sink": "target BOS (or end-of-text when the model has no BOS) before the translated chunk",
        "config": asdict(cfg),
        "settings": asdict(settings),
        "wall_time_s": {"data_this_run": round(data_s, 1), "training_total": round(train_s, 1),
                        "this_run_total": round(time.time() - started, 1)},
        "peak_memory_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    translator.save(out, card)
    log(f"wrote {out} and {out.with_suffix('.json')}")
    return out


def score_translator(checkpoint: Path, corpus: Path | None = None, log=print) -> dict:
    """Score an existing checkpoint on held-out text again, as training does at its end, and write the scores
    into its card (the weights are not touched). For cards scored before a score existed (recall, for
    instance) or before a scoring fix. The settings (passage sizes, seed, number of passages) come from the
    card, the corpus too unless `corpus` is given. Returns the new held-out scores."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise TranslatorError(f"translator {checkpoint} does not exist; pass a .safetensors checkpoint, "
                              f"for example translators/smollm2__gemma.safetensors")
    translator = read_translator(checkpoint)
    card = translator.card
    if not card.get("source") or not card.get("target"):
        raise TranslatorError(f"{card_path(checkpoint)} does not name the models the translator is for; "
                              f"retrain it with `cagkit translators train`")
    corpus = corpus if corpus is not None else card.get("corpus")
    if not corpus or not Path(corpus).is_dir():
        raise TranslatorError(f"corpus folder '{corpus}' of {checkpoint} does not exist; pass the corpus it was "
                              f"trained on with --corpus (its held-out files are scored)")
    known = {f.name for f in fields(TrainSettings)}
    settings = TrainSettings(**{k: v for k, v in (card.get("settings") or {}).items() if k in known})
    torch.set_num_threads(settings.threads)
    started = time.time()
    src, tgt = load_model(card["source"]["name"], device="cpu"), load_model(card["target"]["name"], device="cpu")
    for role, model, expected in (("source", src, translator.source_fingerprint),
                                  ("target", tgt, translator.target_fingerprint)):
        if model.fingerprint != expected:
            raise TranslatorError(f"{checkpoint} was trained for another {role} model than the installed "
                                  f"'{model.name}' (fingerprint {expected}, installed {model.fingerprint}); retrain "
                                  f"it with `cagkit translators train`")
    corpus = Path(corpus)
    log(f"scoring {checkpoint} on the held-out files of {corpus} ...")
    heldout = evaluate_translator(translator, src, tgt, corpus, settings, native_bottom=(2, tgt.num_layers // 2))
    card["heldout"] = heldout
    card["heldout_scored"] = {"by": "cagkit translators score", "corpus": str(corpus),
                              "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - started, 1)}
    write_card(checkpoint, card)
    return heldout
