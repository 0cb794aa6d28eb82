#!/usr/bin/env bash
# The runs behind BENCHMARKS.md, the paper's table on our three models: for each of the six ordered pairs of
# smollm2, gemma and qwen, every method on SQuAD v2 (F1, whole Wikipedia articles, top-4 retrieved chunks) and on
# RACE (closed-set accuracy by option likelihood, the whole passage as context), 200 questions each, at the
# default placement; then `cagkit report` writes BENCHMARKS.md and the two charts in docs/plots, with
# benchmarks/note.md (how the runs were made) under the title.
#
#   benchmarks/run_eval.sh             # every run, then the report
#   LIMIT=10 benchmarks/run_eval.sh    # fewer questions per run (a larger limit later resumes the same files)
#   PAIRS="smollm2:gemma" benchmarks/run_eval.sh   # some pairs only (the report still reads every file present)
#   RETRIEVAL=dense benchmarks/run_eval.sh   # the embedder's ranking alone, as the committed BENCHMARKS.md ran
#
# Each run writes results/<set>-<source>-<target>.json after every question and resumes from it, so re-running
# this script after an interruption continues where it stopped; delete a results file to redo it. The stores
# (results/stores/<set>-<source>) are ingested once per source model and shared by its targets.
#
# On 2 CPU cores, with one thread per run, a question costs 5-15 s with smollm2 or gemma as the target and
# 20-45 s with qwen: about 15 hours for everything. Two runs at a time (one per core) halve that. Run from the
# repository root with the virtual environment active; the data sets are read from ../shared/data (or
# $CAGKIT_DATA), never copied here.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT="${LIMIT:-200}"
DATA="${CAGKIT_DATA:-../shared/data}/eval"
PAIRS="${PAIRS:-smollm2:gemma smollm2:qwen gemma:qwen qwen:gemma gemma:smollm2 qwen:smollm2}"
METHODS="${METHODS:-native,none,select,source,linear,projector,mot}"
RETRIEVAL="${RETRIEVAL:-hybrid}"  # SQuAD only: RACE gives every method the whole passage
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

for pair in $PAIRS; do
  source_model=${pair%%:*} target=${pair##*:}
  cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --format squad --source "$source_model" \
    --target "$target" --methods "$METHODS" --top-k 4 --retrieval "$RETRIEVAL" --max-new-tokens 24 \
    --limit "$LIMIT" --out "results/squad_v2-$source_model-$target.json"
  cagkit eval --data "$DATA/race/race.jsonl" --format race --source "$source_model" --target "$target" \
    --methods "$METHODS" --top-k 4 --max-new-tokens 24 --limit "$LIMIT" --full-context \
    --out "results/race-$source_model-$target.json"
done

files=()
for pair in smollm2:gemma smollm2:qwen gemma:qwen qwen:gemma gemma:smollm2 qwen:smollm2; do
  for set in squad_v2 race; do
    file="results/$set-${pair%%:*}-${pair##*:}.json"
    [[ -e $file ]] && files+=("$file")
  done
done
cagkit report "${files[@]}" --out BENCHMARKS.md --plots docs/plots --note "$(cat benchmarks/note.md)"

# Other measurements, each documented in the docs/ page of its topic (placement.md, translators.md, speed.md):
#   reuse sanity check (source = target):  cagkit eval ... --source smollm2 --target smollm2 --methods source
#   chunks placed as stored (no repair):   cagkit eval ... --blend 0
#   how many tokens to repair, and which:  python benchmarks/injection_depth.py --target gemma --blends ...
#   injection depth:                       python benchmarks/injection_depth.py --target gemma --depths 0,2,4,9,18
#   time to first token by context size:   python benchmarks/ttft.py
#   multi-agent memory and accuracy:       python benchmarks/multi_agent.py
