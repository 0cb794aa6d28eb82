#!/usr/bin/env bash
# The runs behind BENCHMARKS.md: where the target's context comes from, set beside the `select` control. For each
# pair (smollm2's store answered by gemma and by qwen, qwen's store answered by gemma), every data set is answered
# by native, none, select, mot (the default placement: translated KV with 15% of the tokens recomputed) and
# mot-placed (the same translated KV placed as translated, no recompute), at about 1k retrieved tokens (top-4
# 256-token chunks) and, where the documents are long enough, about 4k (top-16); SQuAD also at one chunk (top-1:
# native, none, mot-placed and oracle, the translation alone against the target's own cache of that chunk). The
# reuse run (smollm2 answering from its own store, below) is read when present. Then `cagkit report` writes
# BENCHMARKS.md and its charts in docs/plots (one quality-against-first-token chart per data set), with
# benchmarks/note.md (how the runs were made) under the title.
#
#   benchmarks/run_eval.sh                           # every run, then the report
#   LIMIT=10 benchmarks/run_eval.sh                  # fewer questions per run (a larger limit resumes the files)
#   PAIRS="smollm2:gemma" benchmarks/run_eval.sh     # some pairs only (the report reads every file present)
#   SETS="squad quality" benchmarks/run_eval.sh      # some data sets only
#
# Each run writes results/<set>-<source>-<target>[-k16].json after every question and resumes from it, so
# re-running this script after an interruption continues where it stopped; delete a results file to redo it. At
# the default LIMIT each run is also copied into docs/results (to be committed) once it has answered more questions
# than the copy there; committed, it survives a restart that wipes results/. The report reads either. The
# stores (results/stores/<data>-<source>) are ingested once per source model and shared by its targets. Data sets:
# SQuAD v2 dev part a (first 200 answerable questions, whole articles as documents, F1), HotpotQA part a (first
# 200, the ten paragraphs as documents, F1), RACE (first 200, the whole passage, accuracy by option likelihood),
# QuALITY from L-Eval part a (every question of its 8 stories, accuracy). HotpotQA and RACE contexts are too short
# for a 4k run. On 2 CPU cores, one thread per run, the gemma runs take minutes to an hour each and the qwen runs
# about three times as long. Run from the repository root with the virtual environment active; the data sets are
# read from ../shared/data (or $CAGKIT_DATA), never copied here.
set -euo pipefail
cd "$(dirname "$0")/.."

LIMIT="${LIMIT:-200}"
DATA="${CAGKIT_DATA:-../shared/data}/eval"
PAIRS="${PAIRS:-smollm2:gemma smollm2:qwen qwen:gemma}"
SETS="${SETS:-squad hotpotqa race quality}"
METHODS="${METHODS:-native,none,select,mot,mot-placed}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

run() {  # run SET SOURCE TARGET TOP_K [METHODS]: one results file
  local set=$1 source_model=$2 target=$3 top_k=$4 methods=${5:-$METHODS} suffix="" data args
  [[ $top_k == 4 ]] || suffix="-k$top_k"
  case $set in
    squad) data="$DATA/squad_v2/dev-v2.0.part-a.json"; args=(--format squad --limit "$LIMIT") ;;
    hotpotqa) data="$DATA/hotpotqa/dev_subsampled.part-a.jsonl"; args=(--format hotpotqa --limit "$LIMIT") ;;
    race) data="$DATA/race/race.jsonl"; args=(--format race --limit "$LIMIT" --full-context) ;;
    quality) data="$DATA/leval/quality.part-a.jsonl"; args=(--format leval) ;;
  esac
  local out="${set/squad/squad_v2}-$source_model-$target$suffix.json"
  local status=0
  cagkit eval --data "$data" "${args[@]}" --source "$source_model" --target "$target" --methods "$methods" \
    --top-k "$top_k" --max-new-tokens 24 --scope chunks --prefill chunks --out "results/$out" || status=$?
  keep "$out"  # what a failed run answered is kept as well
  return $status
}

# keep FILE: copy results/FILE over docs/results/FILE (the committed copy, which a restart of this machine does not
# wipe) when this run used the full 200 questions and answered more of them than the copy; a LIMIT=10 trial never
# replaces a committed run.
keep() {
  [[ $LIMIT == 200 ]] || return 0
  python - "results/$1" "docs/results/$1" <<'PY'
import json, shutil, sys
from pathlib import Path

def answered(path):  # the questions every method has answered
    return min(m["n"] for m in json.loads(Path(path).read_text())["methods"].values()) if Path(path).exists() else -1

if answered(sys.argv[1]) > answered(sys.argv[2]):
    shutil.copyfile(sys.argv[1], sys.argv[2])
    print(f"kept {sys.argv[1]} in {sys.argv[2]}")
PY
}

for pair in $PAIRS; do
  for set in $SETS; do
    run "$set" "${pair%%:*}" "${pair##*:}" 4
    [[ $set == squad || $set == quality ]] && run "$set" "${pair%%:*}" "${pair##*:}" 16
  done
  # the translation alone: one chunk placed as translated, against the target's own cache of it (oracle)
  [[ " $SETS " == *" squad "* ]] && run squad "${pair%%:*}" "${pair##*:}" 1 native,none,mot-placed,oracle
done

# Each run from results/ when this machine made it, else from the copy committed in docs/results, so a run of some
# pairs or sets re-renders the whole report.
files=()
add() { if [[ -e results/$1 ]]; then files+=("results/$1"); elif [[ -e docs/results/$1 ]]; then files+=("docs/results/$1"); fi; }
for pair in smollm2:gemma smollm2:qwen qwen:gemma; do
  for set in squad_v2 hotpotqa race quality; do
    for suffix in "" -k16 -k1; do
      add "$set-${pair%%:*}-${pair##*:}$suffix.json"
    done
  done
done
add squad_v2-smollm2-smollm2.json  # reuse, below
cagkit report "${files[@]}" --out BENCHMARKS.md --plots docs/plots --note "$(cat benchmarks/note.md)"

# Other measurements, each documented in the docs/ page of its topic (placement.md, translators.md, speed.md):
#   the six-pair table of 2026-11 (every translator kind): docs/results/six-pairs.md
#   reuse (source = target):               cagkit eval ... --source smollm2 --target smollm2 --methods native,none,select,source
#   how many tokens to repair, and which:  python benchmarks/injection_depth.py --target gemma --blends ...
#   injection depth:                       python benchmarks/injection_depth.py --target gemma --depths 0,2,4,9,18
#   time to first token by context size:   python benchmarks/ttft.py
#   multi-agent memory and accuracy:       python benchmarks/multi_agent.py
