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

LIMIT="${LIMIT:-100}"
DATA="${CAGKIT_DATA:-../shared/data}/eval"  # the shared public data sets, not committed here
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"

# Reuse sanity check: source = target, so source/linear/projector/mot all read the stored cache unchanged.
cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --source smollm2 --target smollm2 \
  --methods native,none,source --limit "$LIMIT" --out results/squad_v2-smollm2-smollm2.json

# Every method, smollm2's stored cache answered by gemma and by qwen, with the default placement (15% of the
# context tokens, the sentences closest to the question, recomputed across chunks): both_targets NAME FILE [flags].
# `oracle` (the target's own per-chunk caches) is the ceiling of every translated method on this store layout.
METHODS="native,none,source,linear,projector,mot,oracle"
both_targets() {
  local name=$1 file=$2
  shift 2
  for target in gemma qwen; do
    cagkit eval --data "$DATA/$file" --source smollm2 --target "$target" --methods "$METHODS" \
      --limit "$LIMIT" "$@" --out "results/$name-smollm2-$target.json"
  done
}

# Open questions (F1 / exact match): SQuAD v2 (whole Wikipedia articles, retrieval) and HotpotQA (10 paragraphs).
both_targets squad_v2 squad_v2/dev-v2.0.part-a.json
both_targets hotpotqa hotpotqa/dev_subsampled.part-a.jsonl

# Long documents: L-Eval scientific QA (free-form, longer answers) and QuALITY / TOEFL (closed-set, 4 options).
both_targets leval_scientific_qa leval/scientific_qa.part-a.jsonl --max-new-tokens 64
both_targets leval_quality leval/quality.part-a.jsonl
both_targets leval_tpo leval/tpo.part-a.jsonl

# Short articles (about 350 tokens): RACE, closed-set, the whole article as context.
LIMIT="${RACE_LIMIT:-200}" both_targets race race/race.jsonl --full-context

# Every method again on SQuAD with the chunks placed exactly as stored or translated (no cross-chunk repair): what
# the translators carry on their own. The runs above use the default, 15% of the tokens recomputed by question.
for target in gemma qwen; do
  cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --source smollm2 --target "$target" --methods "$METHODS" \
    --limit "$LIMIT" --blend 0 --out "results/squad_v2-smollm2-$target-as-stored.json"
done

# Which tokens to recompute and how many: the question's sentences against CacheBlend's deviation, for MoT.
python benchmarks/injection_depth.py --target gemma --blends 0.05,0.15,0.3 --blend-select question --kinds mot,linear \
  --limit "$LIMIT"
python benchmarks/injection_depth.py --target gemma --blends 0.15,0.5 --kinds mot --limit "$LIMIT"

# Injection depth: quality and TTFT as the target recomputes 0..L of its bottom layers over each chunk.
python benchmarks/injection_depth.py --target gemma --depths 0,2,4,9,18 --limit 30

cagkit report results/squad_v2-*.json results/hotpotqa-*.json results/leval_*.json results/race-*.json \
  --out BENCHMARKS.md --plots docs/plots
