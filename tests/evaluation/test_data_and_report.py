"""Evaluation datasets, metrics and report: tiny made-up fixtures in every raw format."""

import json
import math
import os
from pathlib import Path

import pytest

from cagkit.config import Placement
from cagkit.errors import CagkitError
from cagkit.evaluation.datasets import FORMATS, Example, detect_format, load_examples, split_options
from cagkit.evaluation.metrics import (
    exact_match,
    f1,
    gap_closed_bootstrap,
    letter_or_text_to_index,
    mean,
    median,
    normalize_answer,
    paired_bootstrap,
)
from cagkit.evaluation.report import compare, summary, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --- fixtures mimicking each real file's structure


def squad_file(tmp_path: Path) -> Path:
    data = {
        "version": "v2.0",
        "data": [
            {
                "title": "Moons",
                "paragraphs": [
                    {
                        "context": "Io is a moon of Jupiter.",
                        "qas": [
                            {"question": "Io orbits which planet?", "id": "q1",
                             "answers": [{"text": "Jupiter", "answer_start": 16},
                                         {"text": "Jupiter", "answer_start": 16},
                                         {"text": "a moon of Jupiter", "answer_start": 8}],
                             "is_impossible": False},
                            {"question": "Who built Io?", "id": "q2", "answers": [],
                             "plausible_answers": [{"text": "Jupiter", "answer_start": 16}],
                             "is_impossible": True},
                        ],
                    },
                    {"context": "Titan has lakes.",
                     "qas": [{"question": "What does Titan have?", "id": "q3",
                              "answers": [{"text": "lakes", "answer_start": 10}], "is_impossible": False}]},
                ],
            },
            {"title": "Rivers",
             "paragraphs": [{"context": "The Nile is long.",
                             "qas": [{"question": "What is long?", "id": "q4",
                                      "answers": [{"text": "The Nile", "answer_start": 0}],
                                      "is_impossible": False}]}]},
        ],
    }
    path = tmp_path / "dev-v2.0.part-a.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def hotpotqa_file(tmp_path: Path) -> Path:
    empty = {"number": "", "date": {"day": "", "month": "", "year": ""}}
    return write_jsonl(tmp_path / "dev_subsampled.part-a.jsonl", [{
        "question_id": "5abc",
        "question_text": "Which river flows past the town where Ada was born?",
        "answers_objects": [{**empty, "spans": ["the Wye"]}],
        "contexts": [
            {"id": "0", "title": "Ada Smith", "paragraph_text": "Ada was born in Hay.", "is_supporting": True},
            {"id": "1", "title": "Hay", "paragraph_text": "Hay lies on the Wye.", "is_supporting": True},
        ],
    }])


TPO_RECORD = {
    "instructions": [
        "why does the professor mention the kettle\nA. to explain steam\nB. to show heat\n"
        "C. to start a story\nD. to end the class",
        "what is the lecture mainly about\nA. tea\nB. boats\nC. rain\nD. clocks",
    ],
    "outputs": ["C", "A"],
    "input": "ok ,  today we talk about the kettle and tea",
    "source": "toefl_tpo",
    "evaluation": "exam",
}

QUALITY_RECORD = {
    "instructions": [
        "Why did Mara leave the ship? \n\n (A) She was bored. \n (B) The ship  sank. \n"
        " (C) She was ordered to. \n (D) She wanted to find her brother. "
    ],
    "outputs": ["(D) She wanted to find her brother."],
    "input": "Mara left the ship to find her brother.",
    "source": "quality_raw",
    "evaluation": "exam",
}

SCIENTIFIC_RECORD = {
    "instructions": ["What dataset do they use?", "Is it English? ", "What dataset do they use?"],
    "outputs": ["SQuAD", "Yes", "SQuAD v1.1"],
    "input": "Introduction\nWe use SQuAD v1.1, an English dataset.",
    "source": "scientific_qa",
    "evaluation": "f1",
}

RACE_RECORD = {
    "example_id": "middle42.txt",
    "question_id": 3,
    "article": "Tom has a red bike. He rides it to school.",
    "question": "What colour is Tom's bike?",
    "options": ["Blue.", "Red.", "Green.", "Black."],
    "answer": "B",
    " question_type": "Detail reasoning",
}


# --- parsing each format


def test_jsonl_contract_parses_context_documents_and_choices(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [
        {"id": "a", "question": "Q?", "answers": ["x", "y"], "context": "doc"},
        {"id": "b", "question": "Pick", "answers": ["two"], "documents": ["d1", "d2"],
         "choices": ["one", "two"], "answer_index": 1},
    ])
    assert detect_format(path) == "jsonl"
    first, second = load_examples(path)
    assert first == Example(id="a", question="Q?", answers=["x", "y"], context="doc")
    assert first.context_documents() == ["doc"]
    assert second.context_documents() == ["d1", "d2"]
    assert (second.choices, second.answer_index) == (["one", "two"], 1)


def test_squad_keeps_answerable_questions_over_whole_article(tmp_path):
    path = squad_file(tmp_path)
    assert detect_format(path) == "squad"
    examples = load_examples(path)
    assert [e.id for e in examples] == ["q1", "q3", "q4"]
    assert examples[0].answers == ["Jupiter", "a moon of Jupiter"]  # duplicates dropped, order kept
    assert examples[0].context == "Io is a moon of Jupiter.\n\nTitan has lakes."
    assert examples[1].context == examples[0].context
    assert examples[2].context == "The Nile is long."
    assert examples[0].documents is None and examples[0].choices is None


def test_squad_pretty_printed_is_detected(tmp_path):
    path = squad_file(tmp_path)
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))
    assert detect_format(path) == "squad"
    assert len(load_examples(path)) == 3


def test_hotpotqa_paragraphs_become_documents(tmp_path):
    path = hotpotqa_file(tmp_path)
    assert detect_format(path) == "hotpotqa"
    [example] = load_examples(path)
    assert example.id == "5abc"
    assert example.question == "Which river flows past the town where Ada was born?"
    assert example.answers == ["the Wye"]
    assert example.documents == ["Ada Smith\nAda was born in Hay.", "Hay\nHay lies on the Wye."]
    assert example.context is None


def test_leval_tpo_letter_options(tmp_path):
    path = write_jsonl(tmp_path / "tpo.part-a.jsonl", [TPO_RECORD])
    assert detect_format(path) == "leval"
    first, second = load_examples(path)
    assert first.id == "tpo.part-a-1-0" and second.id == "tpo.part-a-1-1"
    assert first.question == "why does the professor mention the kettle"
    assert first.choices == ["to explain steam", "to show heat", "to start a story", "to end the class"]
    assert first.answer_index == 2 and first.answers == ["to start a story"]
    assert second.answer_index == 0 and second.choices == ["tea", "boats", "rain", "clocks"]
    assert first.context == TPO_RECORD["input"]


def test_leval_quality_parenthesised_options_and_text_gold(tmp_path):
    path = write_jsonl(tmp_path / "quality.part-a.jsonl", [QUALITY_RECORD, QUALITY_RECORD])
    first, second = load_examples(path)
    assert (first.id, second.id) == ("quality.part-a-1-0", "quality.part-a-2-0")
    assert first.question == "Why did Mara leave the ship?"
    assert first.choices == [
        "She was bored.", "The ship  sank.", "She was ordered to.", "She wanted to find her brother."]
    assert first.answer_index == 3
    assert first.answers == ["She wanted to find her brother."]


def test_leval_free_form_merges_repeated_questions(tmp_path):
    path = write_jsonl(tmp_path / "scientific_qa.part-a.jsonl", [SCIENTIFIC_RECORD])
    first, second = load_examples(path)
    assert (first.id, first.question, first.answers) == (
        "scientific_qa.part-a-1-0", "What dataset do they use?", ["SQuAD", "SQuAD v1.1"])
    assert (second.id, second.question, second.answers) == ("scientific_qa.part-a-1-1", "Is it English?", ["Yes"])
    assert first.choices is None and first.answer_index is None


def test_race(tmp_path):
    path = write_jsonl(tmp_path / "race.jsonl", [RACE_RECORD, {**RACE_RECORD, "question_id": 4, "answer": "D"}])
    assert detect_format(path) == "race"
    first, second = load_examples(path)
    assert (first.id, second.id) == ("middle42-3", "middle42-4")
    assert first.question == "What colour is Tom's bike?"
    assert first.choices == ["Blue.", "Red.", "Green.", "Black."]
    assert (first.answer_index, first.answers) == (1, ["Red."])
    assert (second.answer_index, second.answers) == (3, ["Black."])
    assert first.context == RACE_RECORD["article"]


def test_limit_and_explicit_format(tmp_path):
    path = write_jsonl(tmp_path / "race.jsonl", [{**RACE_RECORD, "question_id": i} for i in range(5)])
    assert [e.id for e in load_examples(path, format="race", limit=2)] == ["middle42-0", "middle42-1"]


def test_split_options_without_options_returns_stem():
    assert split_options("  Just a question?\n") == ("Just a question?", [])
    assert split_options("Q\nB. skipped A\nC. x") == ("Q\nB. skipped A\nC. x", [])


# --- errors name the file, the line and the problem


def error_message(path, **kwargs) -> str:
    with pytest.raises(CagkitError) as caught:
        load_examples(path, **kwargs)
    return str(caught.value)


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "question": "Q", "answers": ["x"], "context": "c"}\n{"id": \n')
    message = error_message(path)
    assert str(path) in message and "line 2" in message and "not valid JSON" in message


def test_missing_field_is_named(tmp_path):
    path = tmp_path / "mine.jsonl"
    good, bad = {"id": "a", "question": "Q", "answers": ["x"], "context": "c"}, {"id": "b", "question": "Q"}
    path.write_text(f"{json.dumps(good)}\n\n{json.dumps(bad)}\n")  # blank lines still count
    message = error_message(path, format="jsonl")
    assert f"{path}, line 3" in message and "'answers' is missing" in message


def test_contract_violations_are_named(tmp_path):
    cases = {
        "answers": ({"answers": []}, "'answers' must be a non-empty list"),
        "both": ({"documents": ["d"]}, "give exactly one of 'context'"),
        "index": ({"choices": ["x", "y"], "answer_index": 2}, "'answer_index' must be an integer from 0 to 1, got 2"),
        "gold": ({"choices": ["p", "q"], "answer_index": 1}, "'answers' must contain the correct choice's text 'q'"),
    }
    for name, (change, expected) in cases.items():
        record = {"id": "a", "question": "Q", "answers": ["x"], "context": "c", **change}
        path = write_jsonl(tmp_path / f"{name}.jsonl", [record])
        message = error_message(path)
        assert f"{path}, line 1 (id 'a'): {expected}" in message, message


def test_leval_bad_gold_names_line_and_instruction(tmp_path):
    path = write_jsonl(tmp_path / "tpo.part-a.jsonl", [TPO_RECORD, {**TPO_RECORD, "outputs": ["C", "E"]}])
    message = error_message(path)
    assert f"{path}, line 2, instruction 1: gold output 'E' names none of the 4 options" in message


def test_leval_unpaired_outputs(tmp_path):
    path = write_jsonl(tmp_path / "tpo.part-a.jsonl", [{**TPO_RECORD, "outputs": ["C"]}])
    assert f"{path}, line 1: 2 instructions but 1 outputs" in error_message(path)


def test_squad_error_names_article(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "c"}]}]}))
    message = error_message(path)
    assert f"{path}, article 0" in message and "'qas' is missing" in message


def test_unknown_format_lists_formats_and_flag(tmp_path):
    path = write_jsonl(tmp_path / "odd.jsonl", [{"prompt": "hi"}])
    with pytest.raises(CagkitError) as caught:
        detect_format(path)
    message = str(caught.value)
    assert str(path) in message and "--format" in message
    assert all(name in message for name in FORMATS)
    message = error_message(path, format="csv")
    assert "'csv'" in message and "--format" in message and all(name in message for name in FORMATS)


def test_duplicate_ids_empty_and_missing_files(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", "question": "Q", "answers": ["x"], "context": "c"}] * 2)
    assert "id 'a' appears more than once" in error_message(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert f"{empty}: the dataset file is empty" in error_message(empty)
    missing = tmp_path / "missing.jsonl"
    assert str(missing) in error_message(missing, format="jsonl")


# --- metrics, computed by hand


def test_normalize_answer():
    assert normalize_answer("  The Cat's  hat, an apple!") == "cats hat apple"


def test_f1_and_exact_match_values():
    # tokens: [cat, sat] vs [cat, sat, down] -> precision 1, recall 2/3, F1 = 0.8
    assert f1("the cat sat", ["a cat sat down"]) == pytest.approx(0.8)
    # [big, red, dog] vs [red, dog, barked, loudly] -> P 2/3, R 1/2, F1 = 4/7; best gold wins
    assert f1("big red dog", ["the red dog barked loudly", "elephant"]) == pytest.approx(4 / 7)
    assert f1("Paris", ["London", "paris."]) == 1.0
    assert f1("", ["a"]) == 1.0  # both normalize to nothing
    assert f1("cat", ["dog"]) == 0.0
    assert exact_match("The Cat!", ["dog", "cat"]) == 1.0
    assert exact_match("cat sat", ["cat"]) == 0.0
    with pytest.raises(ValueError):
        f1("x", [])


def test_letter_or_text_to_index():
    choices = ["red apple", "blue sky", "green grass", "a cat"]
    assert letter_or_text_to_index("C", choices) == 2
    assert letter_or_text_to_index("(B) blue sky", choices) == 1
    assert letter_or_text_to_index("D. something", choices) == 3
    assert letter_or_text_to_index("The blue sky.", choices) == 1
    assert letter_or_text_to_index("A cat", choices) == 3  # text, not letter A
    assert letter_or_text_to_index("E", choices) is None
    assert letter_or_text_to_index("no idea", choices) is None


def test_mean_median():
    assert mean([1, 2, 6]) == 3.0
    assert median([5, 1, 3, 100]) == 4.0
    with pytest.raises(ValueError):
        median([])


def test_paired_bootstrap():
    assert paired_bootstrap([1.0] * 30) == (1.0, 1.0, 1.0)  # no spread: the interval is the point
    diffs = [1.0, 0.0] * 100  # mean 0.5, standard error 0.035: a 95% interval of about +-0.07
    mean_, low, high = paired_bootstrap(diffs)
    assert mean_ == 0.5 and 0.41 < low < 0.46 and 0.54 < high < 0.59
    assert paired_bootstrap(diffs) == paired_bootstrap(diffs)  # seeded
    wide = paired_bootstrap(diffs[:20])  # fewer questions, wider interval
    assert wide[2] - wide[1] > high - low
    with pytest.raises(ValueError):
        paired_bootstrap([])


def test_gap_closed_bootstrap():
    # native leads select by 1 on every question; the method gains 1 on half of them: half the gap, with an
    # interval about it that covers the questions' spread
    share, low, high = gap_closed_bootstrap([1.0, 0.0] * 50, [1.0] * 100)
    assert share == 0.5 and 0.39 < low < 0.45 and 0.55 < high < 0.61
    assert gap_closed_bootstrap([1.0] * 10, [1.0] * 10) == (1.0, 1.0, 1.0)
    assert gap_closed_bootstrap([0.5, 0.5], [0.0, -1.0]) is None  # the reference does not lead: nothing to close
    # a resample whose gap is not positive sits at the interval's end instead of being left out
    share, low, high = gap_closed_bootstrap([0.0, 1.0, 0.0], [1.0, 0.0, -0.5])
    assert share == 2.0 and low == -math.inf and high == math.inf
    with pytest.raises(ValueError):
        gap_closed_bootstrap([1.0], [1.0, 1.0])


# --- report


def fake_results(tmp_path: Path) -> list[Path]:
    free_form = {
        "dataset": "squad_v2/dev-v2.0.part-a.json", "format": "squad", "source": "smollm2", "target": "gemma",
        "settings": {"top_k": 4, "full_context": False, "limit": 50, "max_new_tokens": 24, "chunk_tokens": 256},
        "command": "cagkit eval --data squad.json --source smollm2 --target gemma",
        "methods": {
            "mot": {"f1": 0.25, "exact_match": 0.125, "recovery": 0.806, "ttft_ms_median": 95.4,
                    "translate_ms_median": 12.25, "kv_bytes_per_token": 36864, "n": 50, "examples": []},
            "native": {"f1": 0.31, "exact_match": 0.2, "recovery": 1.0, "ttft_ms_median": 812.0,
                       "translate_ms_median": 0.0, "kv_bytes_per_token": 36864, "n": 50,
                       "examples": [{"id": "q1", "prediction": "France", "f1": 1.0, "exact_match": 1.0,
                                     "ttft_ms": 800.1}]},
        },
    }
    closed_set = {
        "dataset": "race/race.jsonl", "format": "race", "source": "smollm2", "target": "qwen",
        "settings": {}, "command": "cagkit eval --data race.jsonl",
        "methods": {"none": {"accuracy": 0.5, "recovery": None, "ttft_ms_median": 20.0, "translate_ms_median": None,
                             "kv_bytes_per_token": 1234567, "n": 8,
                             "examples": [{"id": "m-1", "prediction": "B", "correct": True, "ttft_ms": 20.0}]}},
    }
    paths = [tmp_path / "squad.json", tmp_path / "race.json"]
    for path, run in zip(paths, [free_form, closed_set]):
        path.write_text(json.dumps(run))
    return paths


def test_report_tables_and_plots(tmp_path):
    pytest.importorskip("matplotlib", reason="charts need the optional 'report' extra (matplotlib)")
    out_md, plots = tmp_path / "BENCHMARKS.md", tmp_path / "plots"
    write_report(fake_results(tmp_path), out_md, plots, note="Measured on a test machine.")
    text = out_md.read_text()
    assert text.startswith("# cagkit eval results\n\nMeasured on a test machine.\n\n")
    assert ("| method | F1 | EM | recovery vs native | median TTFT ms | median translate + repair ms "
            "| KV bytes / context token | n |") in text
    assert "| native | 0.310 | 0.200 | 100% | 812 | 0.0 | 36,864 | 50 |" in text
    assert "| mot | 0.250 | 0.125 | 81% | 95 | 12.2 | 36,864 | 50 |" in text
    assert text.index("| native |") < text.index("| mot |")  # known methods in their usual order
    assert "| method | accuracy | recovery vs native |" in text
    assert "| none | 0.500 | — | 20 | — | 1,234,567 | 8 |" in text
    assert "Settings: top_k=4, full_context=false, limit=50, max_new_tokens=24, chunk_tokens=256" in text
    # written before every placement option was recorded: chunks placed as stored, which is no longer the default
    assert "```\ncagkit eval --data squad.json --source smollm2 --target gemma --blend 0\n```" in text
    assert "## smollm2 → gemma, dev-v2.0.part-a.json" in text
    # the two charts of every run, then one quality-against-first-token chart per data set
    for name in ("quality_by_method.png", "quality_vs_ttft.png", "quality_vs_ttft-dev-v2-0-part-a.png",
                 "quality_vs_ttft-race.png"):
        assert f"](plots/{name})" in text
        assert (plots / name).read_bytes().startswith(PNG_SIGNATURE)
    assert "![race.jsonl: quality against median time to first token](plots/quality_vs_ttft-race.png)" in text
    write_report(fake_results(tmp_path)[:1], tmp_path / "one.md", tmp_path / "one")  # one data set: no repeat
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["quality_by_method.png", "quality_vs_ttft.png"]


def test_report_names_placement_options_in_the_run_label(tmp_path):
    pytest.importorskip("matplotlib", reason="charts need the optional 'report' extra (matplotlib)")
    plain, blended = fake_results(tmp_path)[0], tmp_path / "blended.json"
    run = json.loads(plain.read_text())
    run["settings"]["blend"] = 0.5
    blended.write_text(json.dumps(run))
    write_report([plain, blended], tmp_path / "B.md", tmp_path / "plots")
    text = (tmp_path / "B.md").read_text()
    assert "## smollm2 → gemma, dev-v2.0.part-a.json\n" in text
    assert "## smollm2 → gemma, dev-v2.0.part-a.json, blend 0.5\n" in text
    assert "--target gemma --blend 0.5 --blend-select deviation\n```" in text  # reproduces it under today's defaults
    as_stored = tmp_path / "as_stored.json"
    for blend, shown in [(0.0, False), (0.5, True)]:
        as_stored.write_text(json.dumps({**run, "settings": {**run["settings"], "blend": blend,
                                                             "blend_select": "question"}}))
        write_report([as_stored], tmp_path / "D.md", tmp_path / "plots")
        # which tokens a blend picks is in the settings line only when there is a blend
        assert ('blend_select="question"' in (tmp_path / "D.md").read_text()) is shown
    as_stored.write_text(json.dumps({**run, "settings": {**run["settings"], "store_dtype": "int8"}}))
    write_report([as_stored], tmp_path / "D.md", tmp_path / "plots")  # an older command without the store's dtype
    assert "--dtype int8\n```" in (tmp_path / "D.md").read_text()
    as_stored.write_text(json.dumps({**run, "device": "cuda:0"}))  # the device the times were taken on is named
    write_report([as_stored], tmp_path / "D.md", tmp_path / "plots")
    assert 'device="cuda:0"' in (tmp_path / "D.md").read_text()
    run["settings"].update(Placement().settings())  # a run at today's default records every option
    blended.write_text(json.dumps(run))
    write_report([blended], tmp_path / "C.md", tmp_path / "plots")
    text = (tmp_path / "C.md").read_text()
    assert "## smollm2 → gemma, dev-v2.0.part-a.json, blend 0.15 by question\n" in text
    blended.write_text(json.dumps({**run, "settings": {**run["settings"], "top_k": 16}}))  # ~4k tokens, not ~1k
    write_report([blended], tmp_path / "F.md", tmp_path / "plots")
    assert "## smollm2 → gemma, dev-v2.0.part-a.json, top-16, blend 0.15 by question\n" in (tmp_path / "F.md").read_text()
    assert "```\ncagkit eval --data squad.json --source smollm2 --target gemma\n```" in text
    # a retrieval other than dense is named (files without the setting ranked by the embedder alone)
    for settings, label in [({"retrieval": "hybrid"}, ", hybrid retrieval, blend"), ({"retrieval": "dense"}, ", blend"),
                            ({"retrieval": "lexical", "full_context": True}, ", blend")]:
        blended.write_text(json.dumps({**run, "settings": {**run["settings"], **settings}}))
        write_report([blended], tmp_path / "E.md", tmp_path / "plots")
        assert f"## smollm2 → gemma, dev-v2.0.part-a.json{label} 0.15 by question\n" in (tmp_path / "E.md").read_text()
    # --blend left to the scope: at document scope the stored methods place whole documents as stored
    for scope, label in [("document", ", scope document\n"), ("chunks", ", blend 0.15 by question\n")]:
        blended.write_text(json.dumps({**run, "settings": {**run["settings"], "scope": scope, "blend_by_scope": True}}))
        write_report([blended], tmp_path / "G.md", tmp_path / "plots")
        assert f"## smollm2 → gemma, dev-v2.0.part-a.json{label}" in (tmp_path / "G.md").read_text()


def _run_with_records(closed_set: bool, per_method: dict[str, list[float]]) -> dict:
    """A results dict whose methods score the given per-question values (F1, or 1/0 for right/wrong)."""
    methods = {}
    for name, values in per_method.items():
        examples = [{"id": f"q{i}", "prediction": "x", "ttft_ms": 1.0,
                     **({"correct": bool(v)} if closed_set else {"f1": v, "exact_match": v})}
                    for i, v in enumerate(values)]
        quality = {"accuracy": mean(values)} if closed_set else {"f1": mean(values), "exact_match": mean(values)}
        methods[name] = {**quality, "n": len(values), "examples": examples}
    return {"dataset": "race/race.jsonl" if closed_set else "squad/dev.json", "source": "smollm2",
            "target": "gemma", "command": "cagkit eval", "methods": methods}


def test_report_summary_is_the_papers_table():
    closed = _run_with_records(True, {"native": [1, 1, 1, 0] * 25, "none": [1, 0, 0, 0] * 25,
                                      "linear": [1, 1, 0, 0] * 25, "projector": [1, 0, 0, 0] * 25,
                                      "mot": [1, 1, 1, 0] * 25})
    free = _run_with_records(False, {"native": [0.5] * 40, "mot": [0.25] * 40, "linear": [0.3] * 5})
    text = "\n".join(summary([free, closed]))
    assert text.index("Quality: accuracy") < text.index("Quality: F1")  # one table per family, accuracy first
    rows = [line for line in text.splitlines() if line.startswith("| smollm2")]
    assert rows[0] == ("| smollm2 → gemma | race.jsonl | 100 | 0.750 | 0.250 | 0.500 | 0.250 | 0.750 | 100% "
                       "| 1.50x (linear) | +0.250 (+0.170 to +0.340) | +0.500 (+0.410 to +0.600) |")
    # linear stopped after 5 of 40 questions and there is no none: ratios and intervals that need them are dashes
    assert rows[1] == "| smollm2 → gemma | dev.json | 40 | 0.500 | 0.300 (5 q) | 0.250 | 50% | — | — | — |"
    # a method stopped short is shown with its count and left out of the ratios: linear is the best single path
    short = _run_with_records(True, {"native": [1, 1, 1, 0] * 25, "none": [1, 0, 0, 0] * 25,
                                     "linear": [1, 1, 0, 0] * 25, "projector": [1, 1, 1, 1] * 3,
                                     "mot": [1, 1, 1, 0] * 25})
    row = [line for line in summary([short]) if line.startswith("| smollm2")][0]
    assert row.startswith("| smollm2 → gemma | race.jsonl | 100 | 0.750 | 0.250 | 0.500 | 1.000 (12 q) | 0.750 "
                          "| 100% | 1.50x (linear) | +0.250 ")


def test_report_names_the_methods_no_other_dominates():
    """Dominated: another method answers sooner and better, by the mean, or beyond noise for the second column."""
    select = [1.0, 0.0, 0.0, 0.0] * 25  # 0.25, the fastest with context
    run = _run_with_records(False, {"none": [0.0] * 100, "select": select,
                                    "mot": [1.0, 0.0, 0.0, 0.0] * 24 + [0.0, 0.0, 0.0, 0.0] * 1,  # 0.24, slower
                                    "mot-placed": [0.0] * 100,  # 0.0, slower than none
                                    "native": [1.0, 1.0, 0.0, 0.0] * 25})  # 0.5, slowest
    for method, ms in {"none": 100, "select": 500, "mot": 900, "mot-placed": 700, "native": 2000}.items():
        run["methods"][method]["ttft_ms_median"] = ms
    text = "\n".join(summary([run]))
    row = next(line for line in text[text.index("Quality and median time"):].splitlines()
               if line.startswith("| smollm2"))
    assert row == ("| smollm2 → gemma | dev.json | 0.500 · 2.00 | 0.000 · 0.10 | 0.250 · 0.50 | 0.240 · 0.90 "
                   "| 0.000 · 0.70 | native, none, select | native, none, select, mot |")
    # mot is 0.01 below select by the mean, one question in a hundred: not beyond noise; mot-placed is below
    # none by nothing at all, but select beats it beyond noise and sooner


def test_report_pairs_every_method_against_select(tmp_path):
    select = [1.0, 0.0, 0.0, 0.0] * 25  # 0.25
    mot = [1.0, 1.0, 0.0, 0.0] * 25  # 0.5: +0.25 against select, one question in four
    native = [0.0, 0.0, 0.0, 0.0] * 25  # -0.25: below select outside noise
    run = _run_with_records(False, {"native": native, "none": [0.0] * 100, "mot": mot, "select": select,
                                    "linear": [1.0] * 10})  # linear stopped after 10 questions
    text = "\n".join(summary([run]))

    def cell(differences: list[float]) -> str:
        mean_, low, high = paired_bootstrap(differences)
        return f"{mean_:+.3f} ({low:+.3f} to {high:+.3f})"

    # select has its column in the paper's table, between the controls and the methods that read stored KV
    assert "| pair | data | questions | native | none | select | linear | mot |" in text
    assert "| 0.000 | 0.000 | 0.250 | 1.000 (10 q) | 0.500 |" in text
    against = text[text.index("Against `select`"):]
    assert "| pair | data | select | native − select | none − select | linear − select | mot − select |" in against
    row = next(line for line in against.splitlines() if line.startswith("| smollm2"))
    mot_cell, native_cell = cell([m - s for m, s in zip(mot, select)]), cell([-s for s in select])
    assert row == (f"| smollm2 → gemma | dev.json | 0.250 | {native_cell} | {native_cell} "
                   f"| {cell([1.0 - s for s in select[:10]])} | {mot_cell} |")  # linear over its 10 questions only
    assert mot_cell.startswith("+0.250 (+0.1") and native_cell.startswith("-0.250 (-0.3")  # 25 of 100 differ by 1
    assert native_cell.endswith(" to -0.170)")  # the whole interval below 0: select is better beyond noise

    pytest.importorskip("matplotlib", reason="charts need the optional 'report' extra (matplotlib)")
    path = tmp_path / "select.json"
    path.write_text(json.dumps(run))
    write_report([path], tmp_path / "R.md", tmp_path / "plots")
    report = (tmp_path / "R.md").read_text()
    # the run's own table: a column against select, a dash on select's own row; native trails select here, so
    # there is no gap for a method to close
    assert ("| method | F1 | EM | − select (95% CI) | share of the native − select gap closed (95% CI) "
            "| recovery vs native |") in report
    assert f"| mot | 0.500 | 0.500 | {mot_cell} | — | — |" in report
    assert "| select | 0.250 | 0.250 | — | — | — |" in report
    assert report.index("| none |") < report.index("| select |") < report.index("| linear |")
    # a run without select keeps its tables as they were
    write_report(fake_results(tmp_path)[:1], tmp_path / "S.md", tmp_path / "plots")
    assert "select" not in (tmp_path / "S.md").read_text()


def test_compare_pairs_questions_across_results_files(tmp_path, capsys):
    from cagkit.cli import main

    base = _run_with_records(False, {"mot": [0.5, 0.0] * 50, "native": [1.0, 0.0] * 50})
    base["settings"] = {"top_k": 1, "blend": 0.0}
    other = _run_with_records(False, {"mot": [1.0, 0.0] * 50})
    other["methods"]["mot"]["examples"] = other["methods"]["mot"]["examples"][::-1]  # pairs by id, not by order
    for r in other["methods"]["mot"]["examples"][:30]:
        r["prediction"] = "y"  # 30 answers differ from the baseline's word for word
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(base))
    b.write_text(json.dumps(other))
    rows = compare([str(a), f"{b}:mot", f"{a}:native"])
    assert [(r["method"], r["quality"], r["ratio"]) for r in rows] == [("mot", 0.25, None), ("mot", 0.5, 2.0),
                                                                        ("native", 0.5, 2.0)]
    assert rows[0]["placement"] == "top-1, as stored" and rows[0]["difference"] is None
    base["methods"]["native"]["placement"] = {"blend": 0.15, "blend_select": "question"}  # one method's own
    a.write_text(json.dumps(base))
    assert compare([str(a), f"{a}:native"])[1]["placement"] == "top-1, blend 0.15 by question"
    for removed, label in (("initial", "at each piece's start"), ("gradual", "narrowing")):  # rules since removed
        base["methods"]["native"]["placement"] = {"blend": 0.3, "blend_select": removed}
        a.write_text(json.dumps(base))
        assert compare([str(a), f"{a}:native"])[1]["placement"] == f"top-1, blend 0.3 {label}"
    # the share of the gap from the first (here mot) to a reference (native) each run closes, over shared
    # questions: the other mot scores what native does, all of it
    gaps = compare([f"{a}:mot", f"{b}:mot"], gap_to=f"{a}:native")
    assert gaps[1]["gap_closed"]["share"] == pytest.approx(1.0) and gaps[1]["gap_closed"]["questions"] == 100
    assert "gap_closed" not in gaps[0]
    assert compare([f"{a}:native", f"{b}:mot"], gap_to=f"{a}:mot")[1]["gap_closed"] is None  # no lead to close
    del base["methods"]["native"]["placement"]
    a.write_text(json.dumps(base))
    base["settings"]["chunk_tokens"] = 128
    a.write_text(json.dumps(base))
    assert compare([str(a), str(b)])[0]["placement"] == "top-1 of 128-token chunks, as stored"
    base["settings"]["chunk_tokens"] = 256  # the default size goes unsaid
    a.write_text(json.dumps(base))
    # b has no settings: written before placements were recorded, its chunks were placed as stored
    difference = rows[1]["difference"]
    assert difference["questions"] == 100 and difference["mean"] == 0.25 and difference["same_answers"] == 70
    assert rows[2]["difference"]["same_answers"] == 100
    assert 0.15 < difference["low"] < 0.25 < difference["high"] < 0.35
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split()[-12:] == ["0.500", "2.00x", "+0.250", f"({difference['low']:+.3f}", "to",
                                    f"{difference['high']:+.3f}),", "100", "q,", "70", "the", "same", "answer"]
    short = _run_with_records(False, {"mot": [1.0] * 10})  # stopped early, on questions the baseline half-answered
    short["methods"]["mot"]["examples"] = [{**r, "id": f"q{2 * i}"} for i, r in enumerate(
        short["methods"]["mot"]["examples"])]
    c = tmp_path / "c.json"
    c.write_text(json.dumps(short))
    row = compare([str(a), str(c)])[1]
    # its quality is over its own 10 questions; the ratio and the difference over the 10 shared ones (0.5 each)
    assert (row["n"], row["quality"], row["ratio"], row["difference"]["mean"]) == (10, 1.0, 2.0, 0.5)
    with pytest.raises(CagkitError, match="no 'projector' results; it has mot, native"):
        compare([f"{a}:projector", str(b)])
    with pytest.raises(CagkitError, match="two or more"):
        compare([str(a)])
    closed = tmp_path / "race.json"
    closed.write_text(json.dumps(_run_with_records(True, {"mot": [1, 0] * 5})))
    with pytest.raises(CagkitError, match="compare runs over the same data"):
        compare([str(a), str(closed)])
    other["methods"]["mot"]["examples"] = [{**r, "id": "x" + r["id"]} for r in other["methods"]["mot"]["examples"]]
    b.write_text(json.dumps(other))
    with pytest.raises(CagkitError, match="shares no scored question"):
        compare([str(a), str(b)])


def test_report_rejects_incomplete_results(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"dataset": "x", "methods": {}}))
    with pytest.raises(CagkitError, match="lacks source, target, command"):
        write_report([bad], tmp_path / "out.md", tmp_path / "plots")
    bad.write_text(json.dumps({"dataset": "x", "source": "s", "target": "t", "command": "c", "methods": {}}))
    with pytest.raises(CagkitError, match=f"{bad}: 'methods' must map one or more method names"):
        write_report([bad], tmp_path / "out.md", tmp_path / "plots")


# --- the real evaluation files, when present

DATA = Path(os.environ.get("CAGKIT_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"))
REAL_FILES = {
    "squad_v2/dev-v2.0.part-a.json": "squad",
    "hotpotqa/dev_subsampled.part-a.jsonl": "hotpotqa",
    "leval/tpo.part-a.jsonl": "leval",
    "leval/quality.part-a.jsonl": "leval",
    "leval/scientific_qa.part-a.jsonl": "leval",
    "race/race.jsonl": "race",
}


@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_real_files_first_examples_are_sane(name):
    path = DATA / "eval" / name
    if not path.exists():
        pytest.skip(f"{path} not found; set CAGKIT_DATA to the shared data folder to run this check")
    assert detect_format(path) == REAL_FILES[name]
    examples = load_examples(path, limit=5)
    assert len(examples) == 5
    for example in examples:
        assert example.question.strip() and example.answers and all(a.strip() for a in example.answers)
        assert example.context_documents() and all(d.strip() for d in example.context_documents())
        if example.choices is not None:
            assert len(example.choices) == 4 and 0 <= example.answer_index < 4
            assert example.answers == [example.choices[example.answer_index]]


def test_a_translators_card_records_what_its_own_answers_scored(tmp_path, capsys):
    """`cagkit translators answers` reads only the methods that answered with this checkpoint (by its digest),
    pairs them against the controls in the same file, and gives the one-chunk gap closed over shared questions."""
    import hashlib

    from cagkit.cli import main
    from cagkit.evaluation.report import translator_answers

    checkpoint = tmp_path / "smollm2__gemma.safetensors"
    checkpoint.write_bytes(b"weights")
    (tmp_path / "smollm2__gemma.json").write_text(json.dumps({"kind": "mot", "steps": 600}))
    digest = hashlib.sha256(b"weights").hexdigest()[:16]
    one_chunk = _run_with_records(False, {"none": [0.0] * 40, "oracle": [1.0] * 40 + [0.0] * 10,
                                          "mot-placed": [1.0, 0.0, 0.0, 0.0] * 10})  # oracle ran 10 more
    one_chunk["settings"] = {"top_k": 1, "blend": 0.15}
    one_chunk["methods"]["mot-placed"].update(translator=digest, placement={"blend": 0.0})
    end_to_end = _run_with_records(True, {"select": [1, 0] * 20, "mot": [1, 1] * 20, "linear": [1, 1] * 20,
                                          "native": [1, 1] * 20})
    end_to_end["settings"] = {"top_k": 4, "blend": 0.15, "blend_select": "question"}
    end_to_end["methods"]["mot"]["translator"] = digest
    end_to_end["methods"]["linear"]["translator"] = "another"  # another checkpoint's answers are not this one's
    paths = [tmp_path / "k1.json", tmp_path / "e2e.json"]
    for path, run in zip(paths, (one_chunk, end_to_end)):
        path.write_text(json.dumps(run))
    entries = translator_answers(digest, paths)
    assert [(e["method"], e["placement"], e["questions"]) for e in entries] == [
        ("mot-placed", "top-1, as stored", 40), ("mot", "top-4, blend 0.15 by question", 40)]
    gap = entries[0]["gap_closed"]  # over the 40 questions all three answered, with its bootstrap interval
    assert entries[0]["f1"] == 0.25 and (gap["questions"], gap["share"]) == (40, 0.25)
    assert 0.05 < gap["low"] < 0.25 < gap["high"] < 0.45
    assert entries[0]["against"]["none"]["mean"] == 0.25 and "select" not in entries[0]["against"]
    assert entries[1]["accuracy"] == 1.0 and entries[1]["against"]["select"]["mean"] == 0.5
    assert "gap_closed" not in entries[1] and "native_gap_closed" not in entries[0]  # no native beside mot-placed
    assert entries[1]["native_gap_closed"] == {"over": "select", "questions": 40, "share": 1.0, "low": 1.0, "high": 1.0}
    assert main(["translators", "answers", str(checkpoint), *map(str, paths)]) == 0
    card = json.loads((tmp_path / "smollm2__gemma.json").read_text())
    assert card["steps"] == 600 and [e["method"] for e in card["answers"]] == ["mot-placed", "mot"]
    printed = capsys.readouterr().out
    assert f"25% ({gap['low']:.0%} to {gap['high']:.0%}) of the none → oracle gap" in printed and "100% (100% to 100%) of native's lead over select" in printed
    main(["translators", "answers", str(checkpoint), str(paths[1])])  # again: the entry is replaced, not added
    assert [e["method"] for e in json.loads((tmp_path / "smollm2__gemma.json").read_text())["answers"]] == [
        "mot-placed", "mot"]
    with pytest.raises(CagkitError, match="e2e.json: no method read the translator 0123"):
        translator_answers("0123", [paths[1]])
    assert main(["translators", "answers", str(tmp_path / "missing.safetensors"), str(paths[0])]) == 2
    assert "missing.safetensors: no such translator checkpoint" in capsys.readouterr().err


def test_report_gives_the_share_of_native_lead_over_the_control_each_method_closes(tmp_path):
    run = _run_with_records(False, {"native": [1.0] * 40, "select": [0.0] * 40, "mot": [1.0, 0.0] * 20})
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    write_report([path], tmp_path / "R.md", tmp_path / "plots")
    text = (tmp_path / "R.md").read_text()
    assert "| − select (95% CI) | share of the native − select gap closed (95% CI) |" in text
    mot = next(line for line in text.splitlines() if line.startswith("| mot |"))
    assert "| 50% (" in mot
    run["methods"]["native"] = _run_with_records(False, {"native": [1.0] + [0.0] * 39})["methods"]["native"]
    path.write_text(json.dumps(run))  # native's lead over select inside the noise: no share of it is given
    write_report([path], tmp_path / "R.md", tmp_path / "plots")
    mot = next(line for line in (tmp_path / "R.md").read_text().splitlines() if line.startswith("| mot |"))
    assert "%" not in mot.split("|")[5]
    del run["methods"]["native"]  # without native in the run there is no gap to speak of
    path.write_text(json.dumps(run))
    write_report([path], tmp_path / "R.md", tmp_path / "plots")
    assert "gap closed" not in (tmp_path / "R.md").read_text()
