"""Speed on a GPU: time to first token of cagkit (stored KV, translated) against the target prefilling the text.

    python benchmarks/gpu.py [--device cuda] [--sizes 512,1024,2048,4096,8192] [--targets gemma,qwen]
        [--source smollm2] [--weights converted|random] [--repeats 5] [--out results/gpu.json]

The context is cagkit's own documentation (README.md, BENCHMARKS.md, docs/*.md, examples/docs/*), chunked and
prefilled by the source model on the device as `cagkit ingest` does (`--chunk-tokens`, default 256). The chunks
are held in memory: no store on disk and no retrieval, so the sentence-embedding model is not needed. For each
target and context size, whole chunks are taken in order until they hold the size in source tokens, and
`answer_from_chunks` with one new token is timed (median of `--repeats` runs after one dropped warm-up) for:

- `native`: the target prefills the prompt with the chunk text in it (`cagkit ask --mode native`);
- `mot`: the stored KV translated by the MoT and placed, only the question prefilled (`--blend 0`);
- `mot+blend`: the same with the cross-chunk repair on 15% of the context tokens, chosen by deviation
  (`--blend 0.15 --blend-select deviation`; the default `question` selection needs the sentence embedder).

`--weights converted` loads the converted models (`cagkit models --convert`) and the shipped translators.
`--weights random` needs only each converted model's config and tokenizer files (what travels to a machine
without the weights): every model is built from its config with random weights and given the real model's
fingerprint, and every translator is built from its card's config with random weights. Speed depends on the
shapes, not the values, so the timings hold for the real weights; the answers are meaningless, and nothing about
quality is measured here. Models run in float32, as cagkit loads them.

Results go to `--out` (rewritten after every measurement): the device, torch and transformers versions, the
source prefill throughput (batched as `cagkit ingest` batches on the device, and one chunk at a time), and one row
per target, size and method.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from cagkit.ask import answer_from_chunks
from cagkit.config import Placement
from cagkit.bench import command_line, write_results
from cagkit.ingest.chunking import chunk_text
from cagkit.ingest.pipeline import prefill_chunks
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.rope import RotaryTables
from cagkit.models.device import synchronize
from cagkit.models.loading import LoadedModel, load_model, register_loaded, resolve_device
from cagkit.models.registry import KNOWN_MODELS, converted_dir
from cagkit.store.store import Hit, StoredChunk

QUESTION = "How does cagkit make a stored chunk usable at any position in the prompt?"
ROOT = Path(__file__).resolve().parent.parent
PLACEMENTS = {"mot": Placement(blend=0.0), "mot+blend": Placement(blend=0.15, blend_select="deviation")}


@dataclass
class MemorySettings:
    source: str
    source_fingerprint: str


class MemoryStore:
    """The part of `cagkit.store.Store` that `answer_from_chunks` reads: settings and `load_chunk`."""

    def __init__(self, settings: MemorySettings, chunks: list[StoredChunk]) -> None:
        self.settings = settings
        self.chunks = {c.chunk_id: c for c in chunks}

    def load_chunk(self, chunk_id: int) -> StoredChunk:
        return self.chunks[chunk_id]


def documentation_text() -> str:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted(p for p in (ROOT / "examples" / "docs").rglob("*") if p.is_file())]
    return "\n\n".join(p.read_text(encoding="utf-8") for p in files)


def random_model(alias: str, device: torch.device) -> LoadedModel:
    """`alias` built from its converted config with random weights, with the real model's fingerprint."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = converted_dir(alias)
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(where)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().to(device)
    info = json.loads((where / "cagkit-model.json").read_text())
    lm = LoadedModel(name=alias, model=model, tokenizer=AutoTokenizer.from_pretrained(where),
                     fingerprint=info["fingerprint"], chat=KNOWN_MODELS[alias].chat, info=info)
    register_loaded(alias, lm)
    return lm


def random_translators(source: str, targets: list[str], shipped: Path, fingerprints: dict[str, str]) -> Path:
    """A folder of MoT checkpoints with the shipped cards' configs and random weights; returns it."""
    from cagkit.translate.translator import Translator, TranslatorConfig, TranslatorNet

    folder = Path(tempfile.mkdtemp(prefix="cagkit-gpu-translators-"))
    for target in targets:
        card = json.loads((shipped / f"{source}__{target}.json").read_text())
        torch.manual_seed(0)
        net = TranslatorNet(TranslatorConfig(**card["config"]))
        translator = Translator(net, fingerprints[source], fingerprints[target], card)
        translator.save(folder / f"{source}__{target}.safetensors")
    return folder


def stored_chunks(lm: LoadedModel, text: str, chunk_tokens: int, max_tokens: int) -> tuple[list[StoredChunk], dict]:
    """The text's first chunks (until they hold `max_tokens`) prefilled by `lm` as `cagkit ingest` does, and the
    prefill throughput: batched as ingest batches on this device, and one chunk at a time."""
    chunks, tokens = [], 0
    for chunk in chunk_text(text, lm.count_tokens, chunk_tokens):
        if tokens >= max_tokens:
            break
        chunks.append(chunk)
        tokens += lm.count_tokens(chunk.text)
    tables = RotaryTables(lm.model)
    speed = {}
    for label, batch in (("batched", None), ("one_at_a_time", 0)):
        prefill_chunks(lm, tables, chunks[:2], batch_tokens=batch)  # warm-up
        synchronize(lm.device)
        started = time.perf_counter()
        new = prefill_chunks(lm, tables, chunks, batch_tokens=batch)
        synchronize(lm.device)
        seconds = time.perf_counter() - started
        count = sum(len(c.token_ids) for c in new)
        speed[label] = {"tokens": count, "seconds": round(seconds, 3), "tokens_per_s": round(count / seconds, 1)}
    stored = [StoredChunk(i, "docs", i, c.text, c.token_ids, torch.tensor(c.offsets).reshape(-1, 2),
                          ChunkKV(c.kv.keys.to("cpu", torch.float16), c.kv.values.to("cpu", torch.float16)))
              for i, c in enumerate(new)]  # as a store keeps them
    return stored, speed


def measure(lm, store, hits, mode: str, placement: Placement, repeats: int) -> dict:
    runs = []
    for _ in range(repeats + 1):  # the first run warms up and is dropped
        answer = answer_from_chunks(lm, store, hits, QUESTION, "native" if mode == "native" else "mot",
                                    max_new_tokens=1, placement=placement)
        runs.append(answer.timings)
    runs = runs[1:]
    return {"context_tokens": answer.context_tokens,
            **{key: round(statistics.median(r[key] for r in runs), 2)
               for key in ("ttft_ms", "translate_ms", "prefill_ms", "load_ms")}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="512,1024,2048,4096,8192")
    parser.add_argument("--targets", default="gemma,qwen")
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--weights", default="converted", choices=["converted", "random"])
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cards", default=str(ROOT / "translators"),
                        help="folder of the translator cards whose configs --weights random builds from")
    parser.add_argument("--out", default="results/gpu.json")
    args = parser.parse_args()
    device = resolve_device(args.device)
    sizes = [int(s) for s in args.sizes.split(",")]
    targets = args.targets.split(",")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result = {"settings": {**vars(args), "command": command_line(), "device_name": device_name,
                           "threads": torch.get_num_threads(), "started_at": time.strftime("%Y-%m-%d %H:%M")},
              "rows": []}
    out = Path(args.out)

    def save() -> None:
        write_results(out, result, device=device_name)  # with the machine: cpus, torch, transformers

    if args.weights == "random":
        models = {m: random_model(m, device) for m in [args.source, *targets]}
        fingerprints = {m: lm.fingerprint for m, lm in models.items()}
        os.environ["CAGKIT_TRANSLATORS"] = str(random_translators(args.source, targets, Path(args.cards),
                                                                  fingerprints))
    else:
        models = {m: load_model(m, args.device) for m in [args.source, *targets]}
    source = models[args.source]
    chunks, result["source_prefill"] = stored_chunks(source, documentation_text(), args.chunk_tokens, max(sizes))
    print(json.dumps(result["source_prefill"]), file=sys.stderr, flush=True)
    store = MemoryStore(MemorySettings(source.name, source.fingerprint), chunks)
    for target in targets:
        lm = models[target]
        for size in sizes:
            count, total = 0, 0
            while count < len(chunks) and total < size:
                total += len(chunks[count].token_ids)
                count += 1
            hits = [Hit(c.chunk_id, c.doc_path, c.idx, c.text, 1.0) for c in chunks[:count]]
            for mode in ("native", *PLACEMENTS):
                row = {"target": target, "size": size, "source_tokens": total, "mode": mode,
                       **measure(lm, store, hits, mode, PLACEMENTS.get(mode, Placement()), args.repeats)}
                result["rows"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                save()
    result["settings"]["finished_at"] = time.strftime("%Y-%m-%d %H:%M")
    save()
    _print_table(result)
    return 0


def _print_table(result: dict) -> None:
    rows = result["rows"]
    print(f"\n{'target':<7} {'size':>5} {'native ms':>10} {'mot ms':>8} {'mot+blend ms':>13}  (TTFT, median)")
    for target in dict.fromkeys(r["target"] for r in rows):
        for size in dict.fromkeys(r["size"] for r in rows if r["target"] == target):
            by_mode = {r["mode"]: r["ttft_ms"] for r in rows if r["target"] == target and r["size"] == size}
            print(f"{target:<7} {size:>5} " + " ".join(f"{by_mode.get(m, float('nan')):>{w}.1f}"
                                                       for m, w in (("native", 10), ("mot", 8), ("mot+blend", 13))))


if __name__ == "__main__":
    sys.exit(main())
