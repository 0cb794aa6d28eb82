#!/usr/bin/env bash
# The benchmark runs behind BENCHMARKS.md: every method on each data set, smollm2's stored cache answered by
# gemma and by qwen (and by smollm2 itself, the reuse sanity check). Each run writes results/<name>.json after
# every question and resumes from it, so re-running this script after an interruption continues where it
# stopped; delete a results file to redo it. Stores (results/stores/) are shared across targets and runs.
#
#   benchmarks/run_eval.sh            # all runs, then the report
#   LIMIT=10 benchmarks/run_eval.sh   # fewer questions per run (a different limit still resumes the same file)
#
# On 2 CPU cores a question costs seconds per method with gemma and tens of seconds with qwen; the whole set
# takes hours. Run from the repository root with the virtual environment active.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT="${LIMIT:-50}"
DATA="${CAGKIT_DATA:-../shared/data}/eval"  # the shared public data sets, not committed here
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

# Reuse sanity check: source = target, so source/linear/projector/mot all read the stored cache unchanged.
cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --source smollm2 --target smollm2 \
  --methods native,none,source --limit "$LIMIT" --out results/squad_v2-smollm2-smollm2.json

# Open questions (F1 / exact match): SQuAD v2 (whole Wikipedia articles, retrieval) and HotpotQA (10 paragraphs).
cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --source smollm2 --target gemma \
  --limit "$LIMIT" --out results/squad_v2-smollm2-gemma.json
cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --source smollm2 --target qwen \
  --limit "$LIMIT" --out results/squad_v2-smollm2-qwen.json
cagkit eval --data "$DATA/hotpotqa/dev_subsampled.part-a.jsonl" --source smollm2 --target gemma \
  --limit "$LIMIT" --out results/hotpotqa-smollm2-gemma.json
cagkit eval --data "$DATA/hotpotqa/dev_subsampled.part-a.jsonl" --source smollm2 --target qwen \
  --limit "$LIMIT" --out results/hotpotqa-smollm2-qwen.json

# Long documents: L-Eval scientific QA (free-form, longer answers) and QuALITY / TOEFL (closed-set, 4 options).
cagkit eval --data "$DATA/leval/scientific_qa.part-a.jsonl" --source smollm2 --target gemma \
  --limit "$LIMIT" --max-new-tokens 64 --out results/leval_scientific_qa-smollm2-gemma.json
cagkit eval --data "$DATA/leval/scientific_qa.part-a.jsonl" --source smollm2 --target qwen \
  --limit "$LIMIT" --max-new-tokens 64 --out results/leval_scientific_qa-smollm2-qwen.json
cagkit eval --data "$DATA/leval/quality.part-a.jsonl" --source smollm2 --target gemma \
  --limit "$LIMIT" --out results/leval_quality-smollm2-gemma.json
cagkit eval --data "$DATA/leval/quality.part-a.jsonl" --source smollm2 --target qwen \
  --limit "$LIMIT" --out results/leval_quality-smollm2-qwen.json
cagkit eval --data "$DATA/leval/tpo.part-a.jsonl" --source smollm2 --target gemma \
  --limit "$LIMIT" --out results/leval_tpo-smollm2-gemma.json
cagkit eval --data "$DATA/leval/tpo.part-a.jsonl" --source smollm2 --target qwen \
  --limit "$LIMIT" --out results/leval_tpo-smollm2-qwen.json

# Short articles (about 350 tokens): RACE, closed-set, the whole article as context.
cagkit eval --data "$DATA/race/race.jsonl" --source smollm2 --target gemma \
  --limit "$LIMIT" --full-context --out results/race-smollm2-gemma.json
cagkit eval --data "$DATA/race/race.jsonl" --source smollm2 --target qwen \
  --limit "$LIMIT" --full-context --out results/race-smollm2-qwen.json

cagkit report results/squad_v2-*.json results/hotpotqa-*.json results/leval_*.json results/race-*.json \
  --out BENCHMARKS.md --plots docs/plots
