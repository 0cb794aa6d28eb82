#!/usr/bin/env bash
# Judge a translator design the way issue #30 asks: by the answers, beside the `select` control, not by its loss.
#
#   benchmarks/judge_translator.sh NAME FOLDER [SOURCE TARGET]
#
# FOLDER holds the candidate as <source>__<target>.safetensors (train it with `cagkit translators train ... --out
# FOLDER/<source>__<target>.safetensors`); NAME names its results files, docs/results/designs/<run>-NAME.json.
# Two runs, each resumable (rerun the script to continue):
#   one chunk   SQuAD v2 part a, first $LIMIT questions, one retrieved chunk: none, oracle (the target's own
#               cache of that chunk) and the candidate's chunk placed as translated (mot-placed): the share of the
#               none -> oracle gap it closes.
#   end to end  HotpotQA part a, first $HOTPOT_LIMIT questions, four chunks: select and the candidate with the
#               default placement (mot), paired in one file.
# Then `cagkit translators answers` writes both into the candidate's card and prints them, each paired difference
# with its bootstrap interval. The shipped translator's own runs (benchmarks/run_eval.sh) go into its card the same
# way: `cagkit translators answers translators/smollm2__gemma.safetensors docs/results/<run>.json ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 folder=$2 source_model=${3:-smollm2} target=${4:-gemma}
LIMIT="${LIMIT:-200}" HOTPOT_LIMIT="${HOTPOT_LIMIT:-100}"
DATA="${CAGKIT_DATA:-../shared/data}/eval"
out=docs/results/designs
mkdir -p "$out"
export CAGKIT_TRANSLATORS="$folder"
common=(--source "$source_model" --target "$target" --max-new-tokens 24 --threads "${THREADS:-1}")
cagkit eval --data "$DATA/squad_v2/dev-v2.0.part-a.json" --format squad "${common[@]}" --methods none,oracle,mot-placed \
  --top-k 1 --limit "$LIMIT" --out "$out/squad_v2-$source_model-$target-k1-$name.json"
cagkit eval --data "$DATA/hotpotqa/dev_subsampled.part-a.jsonl" --format hotpotqa "${common[@]}" \
  --methods select,mot --top-k 4 --limit "$HOTPOT_LIMIT" --out "$out/hotpotqa-$source_model-$target-$name.json"
cagkit translators answers "$folder/$source_model""__$target.safetensors" \
  "$out/squad_v2-$source_model-$target-k1-$name.json" "$out/hotpotqa-$source_model-$target-$name.json"
