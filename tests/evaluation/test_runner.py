"""`cagkit eval`'s runner on tiny random Llama models with the real SmolLM2 tokenizer: results schema, closed-set
scoring against a hand computation, restricted retrieval, missing translators and resuming."""

import importlib
import json

import pytest
import torch

from cagkit.config import AS_STORED
from cagkit.errors import CagkitError
from cagkit.evaluation import runner
from cagkit.evaluation.datasets import Example
from cagkit.evaluation.runner import example_hits, run_eval, summarize, write_documents
from cagkit.generation import prompt_parts
from cagkit.ingest.pipeline import ingest
from cagkit.models.loading import LoadedModel
from cagkit.store.store import Store

SOURCE, OTHER = "tiny-llama", "tiny-gemma"  # conftest's tiny random models with the SmolLM2 tokenizer
PARIS = "Paris is the capital of France. The Seine flows through Paris, past the Louvre and Notre-Dame."
CHOICES = ["Paris, on the Seine", "London, in England", "Rome, in Italy"]  # several tokens: each needs its cache copy


@pytest.fixture(scope="module")
def models(tiny_llama, tiny_gemma):
    return {SOURCE: tiny_llama, OTHER: tiny_gemma}


@torch.no_grad()
def full_text_scores(lm: LoadedModel, context: str, question: str, choices: list[str]) -> list[float]:
    """Mean log-likelihood per token of each choice, by one plain forward pass over prompt + choice."""
    prefix, suffix = prompt_parts(lm, question)
    prompt = prefix + lm.tokenizer(context, add_special_tokens=False)["input_ids"] + suffix
    lead = "" if lm.chat else " "  # a chat answer follows "assistant\n" directly, a plain one "Answer:" and a space
    scores = []
    for choice in choices:
        ids = lm.tokenizer(lead + choice, add_special_tokens=False)["input_ids"]
        logprobs = torch.log_softmax(lm.model(input_ids=torch.tensor([prompt + ids])).logits[0], dim=-1)
        scores.append(float(sum(logprobs[len(prompt) + i - 1, t] for i, t in enumerate(ids)) / len(ids)))
    return scores


@pytest.fixture(scope="module")
def data(models, tmp_path_factory):
    """Two open questions and one closed-set one whose gold is the choice the hand computation prefers."""
    expected = full_text_scores(models[SOURCE], PARIS, "What is the capital of France?", CHOICES)
    records = [
        {"id": "open-1", "question": "Where does the Seine flow?", "answers": ["through Paris"], "context": PARIS},
        {"id": "open-2", "question": "Which river is long?", "answers": ["the Nile"],
         "documents": ["The Nile is a long river in Africa.", "Rivers carry water to the sea."]},
        {"id": "closed-1", "question": "What is the capital of France?", "choices": CHOICES,
         "answer_index": expected.index(max(expected)), "answers": [CHOICES[expected.index(max(expected))]],
         "context": PARIS},
    ]
    path = tmp_path_factory.mktemp("data") / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path, expected


@pytest.fixture(scope="module")
def reuse_run(data, tmp_path_factory):
    """native, none and source on the three questions with the source model as the target."""
    work = tmp_path_factory.mktemp("reuse")
    out = run_eval(data=data[0], source=SOURCE, target=SOURCE, methods=["native", "none", "source"],
                   store=work / "store", out=work / "results.json", max_new_tokens=4)
    return json.loads(out.read_text())


def test_results_follow_the_schema_with_a_record_per_question(reuse_run, models):
    run = reuse_run
    assert {"dataset", "format", "source", "target", "settings", "command", "methods"} <= run.keys()
    assert run["format"] == "jsonl" and run["complete"] is True
    assert run["settings"]["top_k"] == 4 and run["settings"]["max_new_tokens"] == 4
    assert run["command"].startswith("cagkit eval --data ") and "--methods native,none,source" in run["command"]
    assert set(run["methods"]) == {"native", "none", "source"}
    # 2 layers x 2 KV heads x head dim 16, keys and values, fp16
    assert models[SOURCE].kv_bytes_per_token(2) == 256
    for method, scores in run["methods"].items():
        assert scores["n"] == 3 and [r["id"] for r in scores["examples"]] == ["open-1", "open-2", "closed-1"]
        assert 0 <= scores["f1"] <= 1 and 0 <= scores["exact_match"] <= 1 and 0 <= scores["accuracy"] <= 1
        assert scores["ttft_ms_median"] > 0 and scores["kv_bytes_per_token"] == 256
        for record in scores["examples"]:
            assert record["ttft_ms"] > 0 and record["translate_ms"] >= 0
            assert ("correct" in record) == (record["id"] == "closed-1")
            assert ("f1" in record and "exact_match" in record) == (record["id"] != "closed-1")
    assert run["methods"]["native"]["recovery"] == 1.0
    assert all(r["context_tokens"] == 0 for r in run["methods"]["none"]["examples"])
    native = {r["id"]: r["context_tokens"] for r in run["methods"]["native"]["examples"]}
    source = {r["id"]: r["context_tokens"] for r in run["methods"]["source"]["examples"]}
    assert native["open-1"] > 10 and source["open-1"] > 10


def test_closed_set_choice_matches_a_full_text_likelihood(reuse_run, data):
    expected = data[1]
    record = next(r for r in reuse_run["methods"]["native"]["examples"] if r["id"] == "closed-1")
    assert record["choice_scores"] == pytest.approx(expected, abs=1e-4)
    assert record["chosen"] == expected.index(max(expected)) and record["correct"] is True
    assert record["prediction"] == CHOICES[record["chosen"]]


@pytest.fixture(scope="module")
def other_target_run(data, tmp_path_factory):
    """native, mot and oracle with a different target (a plain-prompt Gemma 3 with sliding windows) and no
    translator."""
    work = tmp_path_factory.mktemp("other")
    out = run_eval(data=data[0], source=SOURCE, target=OTHER, methods=["native", "mot", "oracle"],
                   store=work / "store", out=work / "results.json", max_new_tokens=2)
    return json.loads(out.read_text())


def test_a_missing_translator_is_recorded_not_raised(other_target_run):
    run = other_target_run
    assert run["methods"]["native"]["n"] == 3 and run["methods"]["native"]["model"] == OTHER
    assert "translator" in run["methods"]["mot"]["error"]
    assert "examples" not in run["methods"]["mot"] and run["complete"] is False


def test_oracle_reads_the_target_s_own_chunk_caches(other_target_run, models):
    oracle, native = other_target_run["methods"]["oracle"], other_target_run["methods"]["native"]
    assert oracle["n"] == 3 and oracle["model"] == OTHER and "error" not in oracle
    assert oracle["kv_bytes_per_token"] == models[OTHER].kv_bytes_per_token(2)
    # Each question here has one chunk per document, so the oracle places exactly the tokens native prefills,
    # except that a two-document context is one text ("\n\n"-joined) for native and two chunks for the oracle.
    tokens = {r["id"]: r["context_tokens"] for r in native["examples"]}
    for record in oracle["examples"]:
        if record["id"] != "open-2":
            assert record["context_tokens"] == tokens[record["id"]] > 10


def test_closed_set_scoring_copes_with_plain_prompts_and_sliding_windows(other_target_run, models):
    # The prompt is longer than the 16-token window, so the copied caches hold only their windows.
    expected = full_text_scores(models[OTHER], PARIS, "What is the capital of France?", CHOICES)
    record = next(r for r in other_target_run["methods"]["native"]["examples"] if r["id"] == "closed-1")
    assert record["choice_scores"] == pytest.approx(expected, abs=1e-4)


def test_resume_computes_only_what_is_missing(data, tmp_path, monkeypatch):
    args = dict(data=data[0], source=SOURCE, target=SOURCE, methods=["native", "none"],
                store=tmp_path / "store", out=tmp_path / "results.json", max_new_tokens=2)
    run_eval(limit=2, **args)
    first = json.loads((tmp_path / "results.json").read_text())
    calls = []
    real = runner.evaluate_example

    def counted(lm, store, hits, example, mode, *args):
        calls.append(example.id)
        return real(lm, store, hits, example, mode, *args)

    monkeypatch.setattr(runner, "evaluate_example", counted)
    run_eval(limit=3, **args)
    assert calls == ["closed-1", "closed-1"]  # one new question, two methods
    run = json.loads((tmp_path / "results.json").read_text())
    assert run["methods"]["native"]["examples"][:2] == first["methods"]["native"]["examples"]
    assert run["methods"]["native"]["n"] == 3

    run_eval(limit=3, **args)
    assert len(calls) == 2
    with pytest.raises(CagkitError, match="top_k"):
        run_eval(limit=3, top_k=2, **args)
    assert run["settings"]["retrieval"] == "hybrid" and "--retrieval" not in run["command"]
    with pytest.raises(CagkitError, match=r"other settings \(retrieval differ\)"):
        run_eval(limit=3, retrieval="dense", **args)
    # a file written before --retrieval existed was ranked by the embedder alone: a dense run resumes it
    del run["settings"]["retrieval"]
    (tmp_path / "results.json").write_text(json.dumps(run))
    with pytest.raises(CagkitError, match="retrieval differ"):
        run_eval(limit=3, **args)
    run_eval(limit=3, retrieval="dense", **args)
    assert len(calls) == 2
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["settings"]["retrieval"] == "dense" and "--retrieval dense" in resumed["command"]


def test_eval_chunk_tokens_builds_its_own_store_and_results(data, tmp_path, monkeypatch):
    from cagkit.cli import main

    monkeypatch.setattr(runner, "RESULTS_DIR", tmp_path)
    argv = ["eval", "--data", str(data[0]), "--source", SOURCE, "--target", SOURCE, "--methods", "none,source",
            "--limit", "1", "--max-new-tokens", "2", "--chunk-tokens", "16"]
    assert main(argv) == 0
    run = json.loads((tmp_path / "tiny-tiny-llama-tiny-llama-c16.json").read_text())
    assert run["settings"]["chunk_tokens"] == 16 and "--chunk-tokens 16" in run["command"]
    with Store.open(tmp_path / "stores" / "tiny-tiny-llama-c16") as store:
        assert store.settings.chunk_tokens == 16
        small = store.num_chunks()
    # the default size keeps the plain names, so the two sizes never mix in one store or results file
    assert main(argv[:-2]) == 0
    default = json.loads((tmp_path / "tiny-tiny-llama-tiny-llama.json").read_text())
    assert default["settings"]["chunk_tokens"] == 256 and "--chunk-tokens" not in default["command"]
    with Store.open(tmp_path / "stores" / "tiny-tiny-llama") as store:
        assert store.settings.chunk_tokens == 256 and store.num_chunks() < small
    # another KV dtype gets its own store too, and the recorded command names it, so a rerun writes the same
    assert main(argv[:-2] + ["--dtype", "int8"]) == 0
    quantized = json.loads((tmp_path / "tiny-tiny-llama-tiny-llama-int8.json").read_text())
    assert quantized["settings"]["store_dtype"] == "int8" and "--dtype int8" in quantized["command"]
    assert "--dtype" not in default["command"]
    # a size too small is refused before anything is written
    assert main(argv[:-1] + ["8"]) == 2
    assert not list((tmp_path / "stores").glob("*-c8*"))


def test_retrieval_keeps_to_the_question_s_own_documents(models, tmp_path):
    long_doc = " ".join(f"Sentence {i} is about the harbour and its ships." for i in range(30))
    examples = [Example("a", "Which ships?", ["x"], context=long_doc),
                Example("b", "Which river?", ["x"], documents=[PARIS, long_doc]),
                Example("c", "Where?", ["x"], context=PARIS)]
    paths = write_documents(examples, tmp_path / "docs")
    assert len(list((tmp_path / "docs").iterdir())) == 2 and paths[0][0] == paths[1][1] and paths[1][0] == paths[2][0]
    ingest([tmp_path / "docs"], store=tmp_path / "store", source=SOURCE, chunk_tokens=16, progress=False)
    with Store.open(tmp_path / "store") as store:
        n_long = len(store.chunk_ids(paths[0][0]))
        assert n_long > 4
        top = example_hits(store, "Which ships?", paths[2], top_k=3, full_context=False)
        assert top and {h.doc_path for h in top} == {paths[2][0]}
        top = example_hits(store, "ships in the harbour", paths[0], top_k=3, full_context=False)
        assert len(top) == 3 and [h.score for h in top] == sorted((h.score for h in top), reverse=True)
        every = example_hits(store, "Which river?", paths[1], top_k=1, full_context=True)
        assert [(h.doc_path, h.idx) for h in every][-n_long:] == [(paths[0][0], i) for i in range(n_long)]
        assert every[0].doc_path == paths[1][0]


def test_summary_scores_recovery_and_medians():
    native = [{"id": "1", "f1": 1.0, "exact_match": 1.0, "ttft_ms": 10.0, "translate_ms": 0.0, "context_tokens": 8},
              {"id": "2", "f1": 0.5, "exact_match": 0.0, "ttft_ms": 30.0, "translate_ms": 0.0, "context_tokens": 4}]
    method = [{"id": "1", "f1": 0.5, "exact_match": 0.0, "ttft_ms": 5.0, "translate_ms": 2.0, "repair_ms": 1.0,
               "context_tokens": 8},
              {"id": "2", "f1": 0.25, "exact_match": 0.0, "ttft_ms": 7.0, "translate_ms": 4.0, "repair_ms": 2.0,
               "context_tokens": 4}]
    summary = summarize(method, native)
    assert summary["f1"] == 0.375 and summary["exact_match"] == 0.0 and "accuracy" not in summary
    assert summary["recovery"] == pytest.approx(0.5)
    assert summary["ttft_ms_median"] == 6.0 and summary["translate_ms_median"] == 3.0 and summary["n"] == 2
    assert summary["repair_ms_median"] == 1.5
    assert summarize(native, None)["repair_ms_median"] is None  # records of files written before it was timed
    closed = [{"id": "1", "correct": True, "ttft_ms": 1.0, "translate_ms": 0.0, "context_tokens": 1},
              {"id": "2", "correct": False, "ttft_ms": 1.0, "translate_ms": 0.0, "context_tokens": 1}]
    assert summarize(closed, closed)["accuracy"] == 0.5 and summarize(closed, closed)["recovery"] == 1.0
    assert summarize(closed, None)["recovery"] is None
    wrong = [dict(r, correct=False) for r in closed]
    assert summarize(closed, wrong)["recovery"] is None  # native scored nothing: no ratio


def save_random_linear_translator(models, folder, seed, kind="linear"):
    """A random translator (`linear` unless `kind` says) from the tiny Llama to the tiny Gemma 3, saved where
    cagkit looks for it."""
    from cagkit.translate.translator import Translator, TranslatorConfig, TranslatorNet, translator_path

    torch.manual_seed(seed)
    net = TranslatorNet(TranslatorConfig.for_models(kind, models[SOURCE], models[OTHER]))
    for layer in net.layers if kind == "linear" else ():  # the others keep PyTorch's random initialisation
        torch.nn.init.normal_(layer.head.weight, std=0.02)
    Translator(net, "tiny-llama-fp", "tiny-gemma-fp", {}).save(translator_path(SOURCE, OTHER, kind))


def test_mot_placed_is_the_mot_without_the_blend_in_the_same_run(models, tmp_path, monkeypatch):
    """`mot-placed` reads the same checkpoint as `mot` and places its chunks as translated, whatever --blend."""
    store = _paris_store_with_a_linear_translator(models, tmp_path, monkeypatch)
    save_random_linear_translator(models, tmp_path / "translators", 1, kind="mot")
    data = tmp_path / "one.jsonl"
    question = "Where does the Seine flow past the Louvre?"
    data.write_text(json.dumps({"id": "q1", "question": question, "answers": ["Paris"],
                                "context": PARIS + " " + PARIS.replace("Paris", "Lyon")}) + "\n")
    out = run_eval(data=data, source=SOURCE, target=OTHER, methods=["mot", "mot-placed"], store=store,
                   out=tmp_path / "results.json", max_new_tokens=2, blend=0.5, chunk_tokens=16)
    run = json.loads(out.read_text())
    mot, placed = run["methods"]["mot"], run["methods"]["mot-placed"]
    assert mot["n"] == placed["n"] == 1 and mot["translator"] == placed["translator"]
    assert placed["placement"]["blend"] == 0 and "placement" not in mot  # mot places as the run says
    assert placed["examples"][0]["translate_ms"] > 0
    # what mot-placed answered from is the MoT's cache with no blend
    assert runner._placement("mot-placed", runner.Placement(blend=0.5)) == AS_STORED
    assert "--methods mot,mot-placed " in run["command"] and run["settings"]["blend"] == 0.5


def _paris_store_with_a_linear_translator(models, tmp_path, monkeypatch):
    """A store of docs/paris.txt ingested by the source, and a random linear translator to the other model."""
    monkeypatch.setenv("CAGKIT_TRANSLATORS", str(tmp_path / "translators"))
    (tmp_path / "translators").mkdir()
    save_random_linear_translator(models, tmp_path / "translators", 0)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "paris.txt").write_text(PARIS + " " + PARIS.replace("Paris", "Lyon"))
    ingest([docs], store=tmp_path / "store", source=SOURCE, chunk_tokens=16, progress=False)
    return tmp_path / "store"


def test_recomputed_bottom_layers_are_the_target_s_own(models, tmp_path, monkeypatch):
    from cagkit.ask import Placement, build_context_cache
    from cagkit.kv.prefill import prefill_kv

    lm = models[OTHER]
    with Store.open(_paris_store_with_a_linear_translator(models, tmp_path, monkeypatch)) as store:
        hits = example_hits(store, "Where?", [str((tmp_path / "docs" / "paris.txt").resolve())], 3, False)

        def layers(mode, k=0):
            cache = build_context_cache(lm, store, hits, "Where?", mode, Placement(recompute_layers=k)).cache
            return [layer.keys for layer in cache.layers]

        oracle, linear, mixed, full = layers("oracle"), layers("linear"), layers("linear", 2), layers("linear", 6)
        for layer in range(6):
            torch.testing.assert_close(full[layer], oracle[layer])
            torch.testing.assert_close(mixed[layer], (oracle if layer < 2 else linear)[layer])
        assert not torch.allclose(linear[3], oracle[3])
        with pytest.raises(CagkitError, match="recompute-layers"):
            build_context_cache(lm, store, hits, "Where?", "linear", Placement(recompute_layers=7))
        with pytest.raises(CagkitError, match="--blend"):
            build_context_cache(lm, store, hits, "Where?", "linear", Placement(blend=-0.1))
        with pytest.raises(CagkitError, match="--blend-select must be one of question, deviation"):
            build_context_cache(lm, store, hits, "Where?", "linear", Placement(blend=0.5, blend_select="random"))
    # A partial prefill gives exactly the bottom layers of a full one.
    ids = lm.tokenizer(PARIS, add_special_tokens=False)["input_ids"]
    whole, bottom = prefill_kv(lm.model, ids), prefill_kv(lm.model, ids, layers=2)
    assert bottom.keys.shape[0] == 2
    torch.testing.assert_close(bottom.keys, whole.keys[:2])
    torch.testing.assert_close(bottom.values, whole.values[:2])


def test_a_changed_translator_is_evaluated_again(data, models, tmp_path, monkeypatch):
    monkeypatch.setenv("CAGKIT_TRANSLATORS", str(tmp_path / "translators"))
    (tmp_path / "translators").mkdir()

    def save_translator(seed):
        save_random_linear_translator(models, tmp_path / "translators", seed)

    args = dict(data=data[0], source=SOURCE, target=OTHER, methods=["native", "linear"], limit=1,
                store=tmp_path / "store", out=tmp_path / "results.json", max_new_tokens=2)
    save_translator(0)
    run_eval(**args)
    first = json.loads((tmp_path / "results.json").read_text())["methods"]["linear"]
    assert first["n"] == 1 and len(first["translator"]) == 16
    calls = []
    real = runner.evaluate_example

    def counted(lm, store, hits, example, mode, *args):
        calls.append(mode)
        return real(lm, store, hits, example, mode, *args)

    monkeypatch.setattr(runner, "evaluate_example", counted)
    run_eval(**args)
    assert calls == []  # same checkpoint: nothing to redo
    save_translator(1)
    run_eval(**args)
    assert calls == ["linear"]  # native's record stands; linear's came from the old checkpoint
    again = json.loads((tmp_path / "results.json").read_text())["methods"]["linear"]
    assert again["n"] == 1 and again["translator"] != first["translator"]
    # A run of one method keeps the others' records, and the recorded command reproduces all of them.
    run_eval(**{**args, "methods": ["linear"]})
    run = json.loads((tmp_path / "results.json").read_text())
    assert run["methods"]["native"]["n"] == 1 and "--methods native,linear " in run["command"]


def test_blend_one_gives_the_target_s_joint_prefill_of_the_chunks(models, tmp_path, monkeypatch):
    """Blending every token of translated chunks is a native prefill of the chunks side by side; a run records
    the blend in its settings and command, and refuses to mix it into a results file without one."""
    from cagkit.ask import Placement, build_context_cache
    from cagkit.generation import prompt_parts
    from cagkit.kv.prefill import prefix_cache

    lm = models[OTHER]
    with Store.open(_paris_store_with_a_linear_translator(models, tmp_path, monkeypatch)) as store:
        hits = example_hits(store, "Where?", [str((tmp_path / "docs" / "paris.txt").resolve())], 3, False)
        blended = build_context_cache(lm, store, hits, "Where?", "linear", Placement(blend=1.0))
        by_question = build_context_cache(lm, store, hits, "Where?", "linear", Placement(blend=1.0, blend_select="question"))
        plain = build_context_cache(lm, store, hits, "Where?", "linear", Placement(blend=0.0))
        placed = sorted(hits, key=lambda h: (h.doc_path, h.idx))
        ids = [t for h in placed for t in lm.tokenizer(h.text, add_special_tokens=False)["input_ids"]]
    prefix_ids, _ = prompt_parts(lm, "Where?")
    joint = prefix_cache(lm.model, prefix_ids + ids)
    for mine, native, translated in zip(blended.cache.layers, joint.layers, plain.cache.layers):
        torch.testing.assert_close(mine.keys, native.keys, atol=2e-4, rtol=1e-3)
        torch.testing.assert_close(mine.values, native.values, atol=2e-4, rtol=1e-3)
    assert not torch.allclose(plain.cache.layers[3].keys, joint.layers[3].keys, atol=1e-3)
    for mine, native in zip(by_question.cache.layers, joint.layers):  # every token chosen, whatever the order
        torch.testing.assert_close(mine.keys, native.keys, atol=2e-4, rtol=1e-3)

    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Where?", "answers": ["Paris"], "context": PARIS}) + "\n")
    args = dict(data=data, source=SOURCE, target=OTHER, methods=["linear"], store=tmp_path / "store2",
                out=tmp_path / "results.json", max_new_tokens=2)
    run_eval(**args, blend=0.5, blend_select="deviation")
    run = json.loads((tmp_path / "results.json").read_text())
    assert run["settings"]["blend"] == 0.5 and "--blend 0.5 --blend-select deviation" in run["command"]
    with pytest.raises(CagkitError, match="blend"):
        run_eval(**args)  # the default, 0.15 by question
    with pytest.raises(CagkitError, match="blend_select"):
        run_eval(**args, blend=0.5)
    # A file written before every placement option was recorded placed the chunks as stored.
    for key in ("recompute_layers", "blend", "blend_select"):
        del run["settings"][key]
    (tmp_path / "results.json").write_text(json.dumps(run))
    with pytest.raises(CagkitError, match="blend"):
        run_eval(**args)
    run_eval(**args, blend=0.0)
    assert "--blend 0 " in json.loads((tmp_path / "results.json").read_text())["command"] + " "


def test_a_results_file_from_before_scope_resumes_only_at_chunk_scope():
    from cagkit.evaluation.runner import _identity

    old = {"dataset": "d.json", "format": "squad", "source": "a", "target": "b", "fingerprints": {},
           "settings": {"top_k": 4, "retrieval": "hybrid", "blend": 0.15, "blend_select": "question"}}
    new = {**old, "settings": {**old["settings"], "scope": "chunks", "blend_by_scope": True}}
    assert _identity(new) == _identity(old)  # --scope chunks, --blend left to the scope: 0.15, as before
    moved = {**old, "settings": {**old["settings"], "scope": "auto", "blend_by_scope": True}}
    assert _identity(moved) != _identity(old)


def test_methods_name_their_own_repair_side_by_side(models, tmp_path, monkeypatch):
    """`stored+question` and `stored+deviation@document` recompute the default share by their own rule beside
    `stored`, which places two documents cached apart as stored (blend 0 at document scope), in one run; the
    report takes `select@chunks` as the run's control."""
    from cagkit.evaluation.report import _section

    data = tmp_path / "two.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Where does the Seine flow?", "answers": ["Paris"],
                                "documents": [PARIS, "The Nile is a long river in Africa. It flows north."]}) + "\n")
    methods = ["stored", "stored+question", "stored+deviation@document", "select@chunks"]
    ask_module = importlib.import_module("cagkit.ask")  # the package's `ask` is the function
    blends = []  # (ratio, priority given) of every repair the answers ran
    real = ask_module.blend_chunks
    monkeypatch.setattr(ask_module, "blend_chunks", lambda *a: blends.append((a[4], a[6] is not None)) or real(*a))
    out = run_eval(data=data, source=SOURCE, target=SOURCE, methods=methods, store=tmp_path / "store",
                   out=tmp_path / "results.json", max_new_tokens=2, scope="document", blend=None)
    run = json.loads(out.read_text())
    got = run["methods"]
    assert run["complete"] and all(got[m]["n"] == 1 for m in methods)
    assert got["stored"]["placement"]["blend"] == 0
    for method, select in (("stored+question", "question"), ("stored+deviation@document", "deviation")):
        assert got[method]["placement"]["blend"] == 0.15 and got[method]["placement"]["blend_select"] == select
        assert got[method]["examples"][0]["scope"] == "document"
    # stored placed the two documents as stored; question ranked tokens by sentence, deviation by the layer-1 error
    assert blends == [(0.15, True), (0.15, False)]
    command = run["command"].split()
    assert set(command[command.index("--methods") + 1].split(",")) == set(methods)
    assert "| stored | " in "\n".join(_section(run)) and "− select@chunks (95% CI)" in "\n".join(_section(run))
    for wrong, says in (("native+question", r"drop the \+question"), ("stored+bogus", r"\+question or \+deviation"),
                        ("stored+initial", r"\+question or \+deviation")):  # EPIC's rule, removed
        with pytest.raises(CagkitError, match=says):
            runner._check_methods([wrong])


def test_a_run_on_a_migrated_copy_reads_the_documents_it_was_copied_with(data, tmp_path):
    """`store migrate --dtype int8` keeps each document's path: eval on the copy finds them ingested, prefills none
    again, and makes no documents folder of its own."""
    from cagkit.cli import main

    args = dict(data=data[0], source=SOURCE, target=SOURCE, methods=["none"], max_new_tokens=2, limit=1)
    run_eval(store=tmp_path / "store", out=tmp_path / "a.json", **args)
    with Store.open(tmp_path / "store") as store:
        held = sorted(d.path for d in store.documents())
    assert main(["store", "migrate", "--store", str(tmp_path / "store"), "--to", str(tmp_path / "copy"),
                 "--dtype", "int8"]) == 0
    run_eval(store=tmp_path / "copy", out=tmp_path / "b.json", dtype="int8", **args)
    with Store.open(tmp_path / "copy") as copy:
        assert sorted(d.path for d in copy.documents()) == held
    assert not (tmp_path / "copy-documents").exists()
    assert runner.documents_dir(tmp_path / "new") == tmp_path / "new-documents"  # no store yet: beside it
