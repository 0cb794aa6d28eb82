"""Training data for translators: paired prefills over a text corpus, stored as shards and read on demand.

Windows of corpus text are cut so the target tokenizes each into exactly `prefix + continuation` tokens. The
prefix text is prefilled alone by the source (as `cagkit ingest` stores a chunk) and its KV gathered at the target
tokens (`cagkit.translate.alignment`); the target prefills `sink + prefix + continuation` natively once, which
gives its RoPE-free prefix KV (the reconstruction target), its hidden states over the continuation and its top
logits there (the Context Correction targets). In a share of the examples (`recall_fraction`) the continuation is
instead a span copied from the prefix: the target replays it natively by looking it up in the context, which is
what answering a question about a document needs, and the translated keys have to support the same look-up.
With `qa_data`, a share of the examples (`qa_fraction`) instead pair a passage of a question-answering file with
the prompt `cagkit ask` gives the target for one of its questions and that question's answer.

Examples are stored in fp16 shards under the work dir; generation resumes shard by shard, and training reads them
from disk on demand (`TrainingData`). Held-out files (any `.txt` under a folder named `testing`, and files named
`test.txt`) are never trained on (`corpus_files`).
"""

from __future__ import annotations

import bisect
import math
import random
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.config import TrainSettings
from cagkit.errors import TranslatorError
from cagkit.files import atomic_write
from cagkit.generation import prompt_parts
from cagkit.kv.prefill import prefill_kv, sink_ids
from cagkit.kv.rope import RotaryTables, remove_rope
from cagkit.models.loading import LoadedModel
from cagkit.translate.alignment import align
from cagkit.translate.translator import source_features


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
    logits = target_logits(target, out.last_hidden_state[0, s + P:])  # [C, V]
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


def target_logits(target: LoadedModel, hidden: torch.Tensor) -> torch.Tensor:
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
        with atomic_write(path) as tmp:  # an interrupted run leaves no half shard to resume from
            torch.save(stacked, tmp)
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
