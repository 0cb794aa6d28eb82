"""The CLI: one-line errors with a non-zero exit, and `ask --json` output that scripts can parse."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from cagkit.ask import ask
from cagkit.cli import main

DOC = ("Cagkit keeps keys without rotary positions, so a stored chunk can be placed anywhere.\n\n"
       "The default source model is SmolLM2, the fastest of the three to prefill.")


@pytest.fixture
def store(tiny_llama, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text(DOC)
    path = tmp_path / "store"
    assert main(["ingest", str(tmp_path / "docs"), "--store", str(path), "--source", "tiny-llama",
                 "--chunk-tokens", "24", "--quiet"]) == 0
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def test_ask_json_prints_one_object_on_the_last_line(store, capsys, tiny_gemma):
    capsys.readouterr()
    assert main(["ask", "Which model is the default source?", "--store", str(store), "--model", "tiny-llama",
                 "--top-k", "1", "--max-new-tokens", "5", "--mode", "mot", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    t = result["timings"]
    assert set(t) == {"model_ms", "retrieve_ms", "select_ms", "load_ms", "translate_ms", "repair_ms", "place_ms",
                      "prefill_ms", "ttft_ms", "total_ms", "tokens_per_s"}
    # the steps before the first token add up to it; reading stored KV is load, not select
    steps = t["retrieve_ms"] + t["select_ms"] + t["load_ms"] + t["translate_ms"] + t["place_ms"] + t["prefill_ms"]
    assert abs(steps - t["ttft_ms"]) < 1e-6 * t["ttft_ms"] + 1e-3
    assert t["load_ms"] > 0 and t["select_ms"] == 0 and t["place_ms"] > 0
    assert result["model"] == "tiny-llama" and result["mode"] == "reuse" and result["retrieval"] == "hybrid"
    assert result["sources"][0]["document"].endswith("notes.md")
    # the same call through the library gives the same (greedy) answer
    again = ask("Which model is the default source?", store=store, model="tiny-llama", top_k=1, max_new_tokens=5,
                mode="mot")
    assert again.answer == result["answer"]
    assert result["timings"]["ttft_ms"] <= result["timings"]["total_ms"]
    # by default the model reads the question's sentences of the retrieved chunks, not the stored KV...
    assert main(["ask", "Which model is the default source?", "--store", str(store), "--model", "tiny-llama",
                 "--top-k", "1", "--max-new-tokens", "5", "--json"]) == 0
    default = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (default["mode"], default["scope"]) == ("select", "chunks")
    # ...and with --mode auto the store's own model reads its stored KV, whole documents where they fit...
    assert main(["ask", "Which model is the default source?", "--store", str(store), "--model", "tiny-llama",
                 "--top-k", "1", "--max-new-tokens", "5", "--json", "--mode", "auto"]) == 0
    own = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (own["mode"], own["scope"], own["placement"]["blend"]) == ("reuse", "document", 0.0)
    assert own["documents"] == [result["sources"][0]["document"]]
    # ...and another target its question's sentences
    assert main(["ask", "Which model is the default source?", "--store", str(store), "--model", "tiny-gemma",
                 "--top-k", "1", "--max-new-tokens", "5", "--json", "--mode", "auto"]) == 0
    other = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (other["mode"], other["scope"]) == ("select", "chunks")  # select reads the retrieved chunks' sentences


def test_ask_streams_the_answer_then_sources_and_timings(store, capsys):
    capsys.readouterr()
    assert main(["ask", "Where can a chunk be placed?", "--store", str(store), "--model", "tiny-llama",
                 "--max-new-tokens", "4", "--mode", "stored"]) == 0
    out = capsys.readouterr().out
    assert "sources:" in out and "notes.md" in out and "first token" in out
    assert "context tokens (1 whole document) by hybrid retrieval: retrieve" in out
    capsys.readouterr()
    assert main(["ask", "Where can a chunk be placed?", "--store", str(store), "--model", "tiny-llama",
                 "--max-new-tokens", "4", "--mode", "stored", "--scope", "chunks"]) == 0
    assert "context tokens (retrieved chunks) by hybrid retrieval" in capsys.readouterr().out


def test_a_bad_scope_is_one_line_before_any_model_loads(store, capsys, monkeypatch):
    import cagkit.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    assert main(["ask", "q", "--store", str(store), "--scope", "page"]) == 2
    assert "unknown --scope 'page'; use one of auto, document, chunks" in _error_line(capsys)


def test_ask_times_the_repair_apart_within_the_placement(store, capsys, monkeypatch):
    import importlib
    import time

    ask_module = importlib.import_module("cagkit.ask")

    def slowed(real):  # 0.3 s more for the translation and for the repair, so each part is seen in its own time
        def slow(*args, **kwargs):
            time.sleep(0.3)
            return real(*args, **kwargs)
        return slow

    context_module = importlib.import_module("cagkit.kv.context")
    # the store's own model reads its KV as stored: that is the "translate" step here
    monkeypatch.setattr(context_module.StoredKV, "chunk_kv", slowed(context_module.StoredKV.chunk_kv))
    monkeypatch.setattr(ask_module, "blend_chunks", slowed(ask_module.blend_chunks))
    base = ["ask", "Where can a chunk be placed?", "--store", str(store), "--model", "tiny-llama",
            "--max-new-tokens", "2", "--mode", "mot"]
    for blend, repaired in (("0.5", True), ("0", False)):
        capsys.readouterr()
        assert main(base + ["--blend", blend, "--json"]) == 0
        timings = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["timings"]
        assert (timings["repair_ms"] >= 300) == repaired, (blend, timings)
        assert timings["translate_ms"] - timings["repair_ms"] >= 300, (blend, timings)
        assert timings["translate_ms"] <= timings["ttft_ms"]
    assert main(base + ["--blend", "0.5"]) == 0
    out = capsys.readouterr().out
    assert " translate " in out and " repair " in out


def test_ask_blend_reaches_the_placement(store, capsys, monkeypatch):
    import importlib

    ask_module = importlib.import_module("cagkit.ask")
    calls = []
    real = ask_module.blend_chunks

    def spy(model, prefix_ids, chunks, chunk_ids, ratio, tables=None, priority=None):
        calls.append((ratio, priority))
        return real(model, prefix_ids, chunks, chunk_ids, ratio, tables, priority)

    monkeypatch.setattr(ask_module, "blend_chunks", spy)
    question = "Where can a chunk be placed?"
    base = ["ask", question, "--store", str(store), "--model", "tiny-llama", "--max-new-tokens", "6", "--mode", "mot",
            "--scope", "chunks"]

    def run(*options, json_out=True):
        capsys.readouterr()
        assert main(base + list(options) + (["--json"] if json_out else [])) == 0
        out = capsys.readouterr().out
        return json.loads(out.strip().splitlines()[-1]) if json_out else out

    # The default: 15% of the tokens, the sentences closest to the question, recomputed.
    result = run()
    assert result["placement"] == {"recompute_layers": 0, "blend": 0.15, "blend_select": "question"}
    (ratio, priority), = calls
    assert ratio == 0.15 and len(priority) == result["context_tokens"]
    assert result["answer"] == ask(question, store=store, model="tiny-llama", max_new_tokens=6, mode="mot",
                                   scope="chunks").answer
    assert "(reuse, blend 0.15 by question), " in run(json_out=False)

    result = run("--blend", "0.5", "--blend-select", "deviation")
    assert result["placement"]["blend"] == 0.5 and calls[-1] == (0.5, None)  # CacheBlend's selection
    assert result["answer"] == ask(question, store=store, model="tiny-llama", max_new_tokens=6, blend=0.5,
                                   blend_select="deviation", mode="mot", scope="chunks").answer
    assert "(reuse, blend 0.5), " in run("--blend", "0.5", "--blend-select", "deviation", json_out=False)

    count = len(calls)
    result = run("--blend", "0")
    assert len(calls) == count  # chunks placed as stored: no blend at all
    assert "(reuse), " in run("--blend", "0", json_out=False)
    assert run("--mode", "native")["placement"] == {}  # a native prefill places nothing


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["ask", "q?", "--store", "{tmp}/nowhere", "--model", "tiny-llama"], "no cagkit store at"),
        (["ask", "q?", "--store", "{store}", "--model", "llama-9000"], "unknown model 'llama-9000'"),
        (["ask", "  ", "--store", "{store}", "--model", "tiny-llama"], "the question is empty"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--top-k", "0"], "--top-k must be at least 1"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--blend", "1.5"], "--blend must be a share"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--blend-select", "random"], "--blend-select must be one of"),
        # placement options are refused before a model or the data is looked at
        (["ask", "q?", "--store", "{store}", "--model", "llama-9000", "--blend", "2"], "--blend must be a share"),
        (["eval", "--data", "{tmp}/none.json", "--target", "tiny-llama", "--recompute-layers", "-1"],
         "--recompute-layers must be 0 or more"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--max-new-tokens", "0"],
         "--max-new-tokens must be at least 1"),
        (["ingest", "{tmp}/missing", "--store", "{store}", "--source", "tiny-llama"], "missing"),
        (["ingest", "{tmp}/docs", "--store", "{tmp}/small", "--source", "tiny-llama", "--chunk-tokens", "8"],
         "--chunk-tokens must be at least 16, got 8"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(store, tmp_path, capsys, argv, expected):
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, store=store) for a in argv]
    assert main(argv) == 2
    assert expected in _error_line(capsys)


def test_ingest_exits_1_when_a_document_is_skipped_and_stores_the_rest(tiny_llama, tmp_path, capsys, caplog):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text(DOC)
    (docs / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (docs / "broken.pdf").write_bytes(b"not a pdf")
    store = tmp_path / "store"
    capsys.readouterr()
    assert main(["ingest", str(docs), "--store", str(store), "--source", "tiny-llama", "--chunk-tokens", "24",
                 "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "1 added" in out and "2 skipped" in out
    skipped = err.strip().splitlines()
    assert len(skipped) == 2, skipped  # one line per file
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("pypdf")]  # nor the PDF library's own
    assert any(line.startswith("skipped ") and "latin1.txt" in line for line in skipped)
    assert any(line.startswith("skipped ") and "broken.pdf" in line for line in skipped)
    assert main(["ask", "Which model is the default source?", "--store", str(store), "--model", "tiny-llama",
                 "--top-k", "1", "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sources"][0]["document"].endswith("good.md")
    (docs / "latin1.txt").unlink()
    (docs / "broken.pdf").unlink()
    assert main(["ingest", str(docs), "--store", str(store), "--source", "tiny-llama", "--chunk-tokens", "24",
                 "--quiet"]) == 0


def test_store_from_another_source_is_refused_on_the_command_line(store, tiny_llama, tmp_path, capsys):
    from cagkit.models.loading import LoadedModel, register_loaded

    register_loaded("cli-other", LoadedModel("cli-other", tiny_llama.model, tiny_llama.tokenizer, "cli-other-fp", True))
    capsys.readouterr()
    assert main(["ingest", str(tmp_path / "docs"), "--store", str(store), "--source", "cli-other",
                 "--chunk-tokens", "24", "--quiet"]) == 2
    line = _error_line(capsys)
    assert "built with source model 'tiny-llama'" in line and "--source tiny-llama" in line


def test_missing_translator_names_the_file_and_the_train_command(store, tiny_gemma, capsys):
    capsys.readouterr()
    assert main(["ask", "q?", "--store", str(store), "--model", "tiny-gemma", "--mode", "mot"]) == 2
    line = _error_line(capsys)
    assert "tiny-llama__tiny-gemma" in line and "cagkit translators train" in line


def _card(next_loss, next_kl, recall=None) -> dict:
    heldout = {"recovery": {"native": 1.0, "translated": next_loss},
               "kl_recovery": {"native": 1.0, "translated": next_kl}}
    if recall:
        heldout["recall"] = {"recovery": {"translated": recall[0]}, "kl_recovery": {"translated": recall[1]}}
    return {"kind": "mot", "steps": 400, "training_tokens": 25600, "heldout": heldout}


def test_translators_list_reads_the_cards_and_says_which_are_near_native(tmp_path, capsys):
    cards = {"a__b": _card(0.97, 0.96, (0.7, 0.71)), "a__c": _card(1.06, 0.65), "b__a.linear": _card(0.4, 0.39),
             "c__a": {}}
    for stem, card in cards.items():
        (tmp_path / f"{stem}.safetensors").write_bytes(b"not read")
        if card:
            (tmp_path / f"{stem}.json").write_text(json.dumps(card))
    assert main(["translators", "list", "--dir", str(tmp_path), "--json"]) == 0
    rows = {(r["source"], r["target"], r["kind"]): r for r in json.loads(capsys.readouterr().out)}
    assert {k: r["near_native"] for k, r in rows.items()} == {
        ("a", "b", "mot"): "yes", ("a", "c", "mot"): "loss only", ("b", "a", "linear"): "no",
        ("c", "a", "mot"): "unknown"}
    assert rows[("a", "b", "mot")]["recall_kl"] == 0.71 and rows[("a", "c", "mot")]["recall_loss"] is None
    assert main(["translators", "list", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:3] == ["a", "b", "mot"] and "0.97 / 0.96" in line and line.endswith("yes")
               for line in lines)


def test_translators_list_names_a_broken_card(tmp_path, capsys):
    (tmp_path / "a__b.safetensors").write_bytes(b"not read")
    (tmp_path / "a__b.json").write_text("{half")
    assert main(["translators", "list", "--dir", str(tmp_path)]) == 2
    line = _error_line(capsys)
    assert "a__b.json" in line and "cagkit translators train --source a --target b" in line


def test_translators_list_names_a_missing_folder(tmp_path, capsys, monkeypatch):
    assert main(["translators", "list", "--dir", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist; check --dir" in _error_line(capsys)
    monkeypatch.setenv("CAGKIT_TRANSLATORS", str(tmp_path / "gone"))
    assert main(["translators", "list"]) == 2
    assert "gone does not exist; check $CAGKIT_TRANSLATORS" in _error_line(capsys)


def test_translators_list_on_the_shipped_folder_has_every_pair(capsys):
    assert main(["translators", "list", "--json"]) == 0
    pairs = {(r["source"], r["target"]) for r in json.loads(capsys.readouterr().out) if r["kind"] == "mot"}
    names = ("smollm2", "gemma", "qwen")
    assert pairs == {(s, t) for s in names for t in names if s != t}


@pytest.mark.parametrize("flags, weights", [([], (1.0, 1.0, 1.0)), (["--ccl-weight", "0"], (1.0, 0.0, 0.0)),
                                             (["--kv-weight", "0", "--ccl-weight", "2"], (0.0, 2.0, 2.0))])
def test_translators_train_passes_the_loss_weights(monkeypatch, tmp_path, flags, weights):
    import cagkit.translate.train as training

    seen = {}
    monkeypatch.setattr(training, "train_translator", lambda **kwargs: seen.update(kwargs) or tmp_path / "t")
    assert main(["translators", "train", "--source", "a", "--target", "b", "--corpus", str(tmp_path), *flags]) == 0
    settings = seen["settings"]
    assert (settings.kv_weight, settings.kl_weight, settings.hidden_weight) == weights
    assert settings.prefix_tokens == 128


def test_translators_train_passes_the_prefix_length_and_seed(monkeypatch, tmp_path):
    import cagkit.translate.train as training

    seen = {}
    monkeypatch.setattr(training, "train_translator", lambda **kwargs: seen.update(kwargs) or tmp_path / "t")
    assert main(["translators", "train", "--source", "a", "--target", "b", "--corpus", str(tmp_path),
                 "--prefix-tokens", "256", "--seed", "3"]) == 0
    settings = seen["settings"]
    assert (settings.prefix_tokens, settings.heldout_prefix_tokens, settings.seed, settings.heldout_seed) == (256, 128, 3, 0)


@pytest.mark.parametrize("flags, qa", [([], (None, None, 0.0, 0)),
                                       (["--qa", "q.json", "--qa-skip", "200"], ("q.json", None, 0.5, 200)),
                                       (["--qa", "q.json", "--qa-format", "squad", "--qa-fraction", "0.25"],
                                        ("q.json", "squad", 0.25, 0))])
def test_translators_train_passes_the_question_answer_options(monkeypatch, tmp_path, flags, qa):
    import cagkit.translate.train as training

    seen = {}
    monkeypatch.setattr(training, "train_translator", lambda **kwargs: seen.update(kwargs) or tmp_path / "t")
    assert main(["translators", "train", "--source", "a", "--target", "b", "--corpus", str(tmp_path), *flags]) == 0
    settings = seen["settings"]
    assert (settings.qa_data, settings.qa_format, settings.qa_fraction, settings.qa_skip) == qa


@pytest.mark.parametrize("flag, sizes", [([], {}), (["--align", "overlap"], {"align_mode": "overlap"}),
                                         (["--width", "320", "--expert-hidden", "256", "--experts", "8",
                                           "--top-k", "1"],
                                          {"width": 320, "expert_hidden": 256, "num_experts": 8, "top_k": 1}),
                                         (["--window", "5"], {"window": 5})])
def test_translators_train_passes_the_alignment_mode_and_sizes(monkeypatch, tmp_path, flag, sizes):
    import cagkit.translate.train as training

    seen = {}

    def fake_train(**kwargs):
        seen.update(kwargs)
        return tmp_path / "t.safetensors"

    monkeypatch.setattr(training, "train_translator", fake_train)
    assert main(["translators", "train", "--source", "a", "--target", "b", "--corpus", str(tmp_path), *flag]) == 0
    # no flag leaves the config's default (and the keys of resumable states trained before the flag existed)
    assert seen["settings"].sizes == sizes


def test_threads_come_from_the_flag_then_the_environment(monkeypatch, tmp_path, capsys):
    import torch

    import cagkit.cli.ingest as ingest_command

    seen = []
    monkeypatch.setattr(ingest_command, "run", lambda args: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("CAGKIT_THREADS", raising=False)
        torch.set_num_threads(2)
        assert main(["ingest", str(tmp_path)]) == 0  # neither: PyTorch keeps its setting
        assert main(["ingest", str(tmp_path), "--threads", "1"]) == 0
        torch.set_num_threads(2)
        monkeypatch.setenv("CAGKIT_THREADS", "1")
        assert main(["ingest", str(tmp_path)]) == 0
        torch.set_num_threads(1)
        assert main(["ingest", str(tmp_path), "--threads", "2"]) == 0  # the flag wins
        assert seen == [2, 1, 1, 2]
        monkeypatch.setenv("CAGKIT_THREADS", "two")
        assert main(["ingest", str(tmp_path)]) == 2
        assert "CAGKIT_THREADS='two' is not a number of threads" in capsys.readouterr().err
        assert main(["ask", "q", "--threads", "0"]) == 2
        assert "--threads 0: give 1 or more" in capsys.readouterr().err
        assert len(seen) == 4  # neither bad value ran the command
    finally:
        torch.set_num_threads(before)


def test_cli_keeps_freed_memory_unless_the_environment_sets_it(monkeypatch):
    import ctypes

    import cagkit.cli as cli

    calls = []

    class Libc:
        def mallopt(self, option, value):
            calls.append((option, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(cli.sys, "platform", "linux")
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    cli._keep_freed_memory()
    assert calls == [(-2, 1 << 30)]  # M_TOP_PAD, 1 GiB
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")  # the user's setting wins: glibc has read it already
    cli._keep_freed_memory()
    assert calls == [(-2, 1 << 30)]


def test_help_and_option_errors_do_not_load_torch():
    """`cagkit --help` and a mistyped option answer at once: no PyTorch or transformers until a command needs them."""
    script = ("import sys\n"
              "from cagkit.cli import main\n"
              "for argv in (['--help'], ['--version'], ['ask', '--help'], ['ask', '--mode', 'bogus', 'q']):\n"
              "    try:\n"
              "        main(argv)\n"
              "    except SystemExit:\n"
              "        pass\n"
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "invalid choice: 'bogus'" in done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert f"cagkit {importlib.metadata.version('cagkit')}\n" in done.stdout  # the installed version, as packaged


def test_commands_that_read_only_files_do_not_load_torch(store):
    """`store info`, `translators list` and `models` read a manifest, cards and configs: they start at once."""
    script = ("import sys\n"
              "from cagkit.cli import main\n"
              f"assert main(['store', 'info', '--store', {str(store)!r}]) == 0\n"
              "assert main(['translators', 'list']) == 0\n"
              "assert main(['models', '--json']) == 0\n"
              "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip().splitlines()
    assert "1 documents" in out[0] and any(line.endswith("notes.md") for line in out)
    assert out[-1] == "[]"


def test_the_package_resolves_its_public_names_on_first_use():
    import cagkit
    import cagkit.ask
    import cagkit.ingest
    from cagkit.ask import ask as ask_function
    from cagkit.ingest.pipeline import ingest as ingest_function
    from cagkit.store.store import Store

    # the submodules of the same names are imported, and the package's names are still the functions
    assert cagkit.ask is ask_function and cagkit.ingest is ingest_function and cagkit.Store is Store
    assert set(cagkit.__all__) <= set(dir(cagkit))
    assert not {"importlib", "sys", "types", "TYPE_CHECKING", "_LAZY"} & set(dir(cagkit))  # only what it offers
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        cagkit.nothing


def test_command_defaults_are_the_configuration_centres(monkeypatch, tmp_path):
    """A default is written once, in cagkit.config: the parser's defaults are read from there, and a training run
    given no option gets exactly the settings `TrainSettings()` has."""
    import dataclasses

    import cagkit.translate.train as training
    from cagkit.cli import build_parser
    from cagkit.config import (
        DEFAULT_EVAL_MAX_NEW_TOKENS,
        DEFAULT_EVAL_METHODS,
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_MODE,
        DEFAULT_MODEL,
        DEFAULT_SCOPE,
        DEFAULT_TOP_K,
        Placement,
        TrainSettings,
    )

    ask_args = build_parser().parse_args(["ask", "q"])
    assert (ask_args.model, ask_args.top_k, ask_args.mode, ask_args.max_new_tokens) == (
        DEFAULT_MODEL, DEFAULT_TOP_K, DEFAULT_MODE, DEFAULT_MAX_NEW_TOKENS)
    # --blend unset: the scope's default (`cagkit.ask.default_blend`), Placement's for chunks
    assert Placement(ask_args.recompute_layers, Placement.blend, ask_args.blend_select) == Placement()
    assert ask_args.blend is None and ask_args.scope == DEFAULT_SCOPE
    eval_args = build_parser().parse_args(["eval", "--data", "d.json", "--target", "t"])
    assert (tuple(eval_args.methods.split(",")), eval_args.top_k, eval_args.max_new_tokens) == (
        DEFAULT_EVAL_METHODS, DEFAULT_TOP_K, DEFAULT_EVAL_MAX_NEW_TOKENS)

    seen = {}
    monkeypatch.setattr(training, "train_translator", lambda **kwargs: seen.update(kwargs) or tmp_path / "t")
    assert main(["translators", "train", "--source", "a", "--target", "b", "--corpus", str(tmp_path)]) == 0
    assert dataclasses.asdict(seen["settings"]) == dataclasses.asdict(TrainSettings())
    assert seen["steps"] is None and seen["kind"] == "mot"  # None: the settings' own number of steps


def test_top_k_below_one_is_refused_before_a_model_loads(store, capsys):
    capsys.readouterr()
    # an unknown model would be the error if the model were loaded first
    assert main(["ask", "q", "--store", str(store), "--model", "no-such-model", "--top-k", "0"]) == 2
    assert "--top-k must be at least 1, got 0" in _error_line(capsys)


def test_a_question_longer_than_the_context_is_refused_with_its_length(store, capsys):
    capsys.readouterr()
    question = "Which model is the default source? " * 700  # about 5,000 tokens; the tiny model reads 4,096
    assert main(["ask", question, "--store", str(store), "--model", "tiny-llama"]) == 2
    line = _error_line(capsys)
    assert "over the model's context of 4096 tokens" in line and "shorten the question" in line
