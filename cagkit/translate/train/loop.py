"""Training a translator end to end (`train_translator`): data, initialisation, the loop, held-out scores, card.

The statistics and the ridge fit (`ridge`) initialise the network; `train_loop` then minimises `batch_losses`
(`losses`) over batches of the paired-prefill shards (`data`), checkpointing a resumable state to the work dir;
the card gets the held-out scores of `heldout.evaluate_translator`.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import resource
import time
from dataclasses import asdict
from pathlib import Path

import torch

from cagkit.config import TrainSettings
from cagkit.errors import TranslatorError
from cagkit.files import atomic_write
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import LoadedModel, load_model
from cagkit.models.registry import cagkit_home
from cagkit.translate.cards import translator_path
from cagkit.translate.train.data import TrainingData, corpus_files, generate_data
from cagkit.translate.train.heldout import evaluate_translator
from cagkit.translate.train.losses import batch_losses
from cagkit.translate.train.ridge import fit_ridge, fit_statistics
from cagkit.translate.translator import Translator, TranslatorConfig, TranslatorNet, read_translator


def _config_key(cfg: TranslatorConfig, settings: TrainSettings) -> str:
    """A short hash of what a training state depends on, so a resume never loads an incompatible state."""
    ignored = ("steps", "threads", "checkpoint_every", "heldout_examples", "heldout_prefix_tokens", "heldout_seed")
    shaping = {k: v for k, v in asdict(settings).items() if k not in ignored}
    if not shaping["full_vocab_kl"]:  # states of runs from before it keep their key
        shaping.pop("full_vocab_kl")
    if not shaping["qa_fraction"]:  # likewise without question-answer continuations
        for name in ("qa_data", "qa_format", "qa_fraction", "qa_skip"):
            shaping.pop(name)
    return hashlib.sha256(json.dumps([asdict(cfg), shaping], sort_keys=True).encode()).hexdigest()[:10]


def _qa_tag(settings: TrainSettings) -> str:
    """The data folder's suffix for question-answer continuations: the file's content, format, share and skip."""
    if not settings.qa_fraction:
        return ""
    digest = hashlib.sha256(Path(settings.qa_data).read_bytes()).hexdigest()[:10]
    return f"-qa{settings.qa_fraction:g}-{digest}-{settings.qa_format or 'auto'}-skip{settings.qa_skip}"


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
            with atomic_write(state_path) as tmp:  # a run stopped mid-write resumes from the previous state
                torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "generator": gen.get_state(),
                            "state": state}, tmp)
    net.eval()
    return state


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
