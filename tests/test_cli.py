"""The CLI: one-line errors with a non-zero exit, and `ask --json` output that scripts can parse."""

from __future__ import annotations

import json

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


def test_ask_json_prints_one_object_on_the_last_line(store, capsys):
    capsys.readouterr()
    assert main(["ask", "Which model is the default source?", "--store", str(store), "--model", "tiny-llama",
                 "--top-k", "1", "--max-new-tokens", "5", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert set(result["timings"]) == {"retrieve_ms", "load_ms", "translate_ms", "prefill_ms", "ttft_ms", "total_ms",
                                      "tokens_per_s"}
    assert result["model"] == "tiny-llama" and result["mode"] == "reuse"
    assert result["sources"][0]["document"].endswith("notes.md")
    # the same call through the library gives the same (greedy) answer
    again = ask("Which model is the default source?", store=store, model="tiny-llama", top_k=1, max_new_tokens=5)
    assert again.answer == result["answer"]
    assert result["timings"]["ttft_ms"] <= result["timings"]["total_ms"]


def test_ask_streams_the_answer_then_sources_and_timings(store, capsys):
    capsys.readouterr()
    assert main(["ask", "Where can a chunk be placed?", "--store", str(store), "--model", "tiny-llama",
                 "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "sources:" in out and "notes.md" in out and "first token" in out


def test_ask_blend_reaches_the_placement(store, capsys, monkeypatch):
    import importlib

    ask_module = importlib.import_module("cagkit.ask")
    ratios, priorities = [], []
    real = ask_module.blend_chunks

    def spy(model, prefix_ids, chunks, chunk_ids, ratio, tables=None, priority=None):
        ratios.append(ratio)
        priorities.append(priority)
        return real(model, prefix_ids, chunks, chunk_ids, ratio, tables, priority)

    monkeypatch.setattr(ask_module, "blend_chunks", spy)
    question = "Where can a chunk be placed?"
    capsys.readouterr()
    assert main(["ask", question, "--store", str(store), "--model", "tiny-llama", "--max-new-tokens", "6",
                 "--blend", "0.5", "--json"]) == 0
    assert ratios == [0.5]
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["placement"] == {"blend": 0.5}
    assert result["answer"] == ask(question, store=store, model="tiny-llama", max_new_tokens=6, blend=0.5).answer
    assert main(["ask", question, "--store", str(store), "--model", "tiny-llama", "--max-new-tokens", "6"]) == 0
    assert ratios == [0.5, 0.5]  # the default places the chunks as stored
    assert "(reuse), " in capsys.readouterr().out
    assert main(["ask", question, "--store", str(store), "--model", "tiny-llama", "--max-new-tokens", "6",
                 "--blend", "0.5"]) == 0
    assert "(reuse, blend 0.5), " in capsys.readouterr().out
    assert priorities == [None, None, None]  # CacheBlend's selection by deviation
    assert main(["ask", question, "--store", str(store), "--model", "tiny-llama", "--max-new-tokens", "6",
                 "--blend", "0.5", "--blend-select", "question", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["placement"] == {"blend": 0.5, "blend_select": "question"}
    assert priorities[-1] is not None and len(priorities[-1]) == result["context_tokens"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["ask", "q?", "--store", "{tmp}/nowhere", "--model", "tiny-llama"], "no cagkit store at"),
        (["ask", "q?", "--store", "{store}", "--model", "llama-9000"], "unknown model 'llama-9000'"),
        (["ask", "  ", "--store", "{store}", "--model", "tiny-llama"], "the question is empty"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--top-k", "0"], "--top-k must be at least 1"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--blend", "1.5"], "--blend must be a share"),
        (["ask", "q?", "--store", "{store}", "--model", "tiny-llama", "--blend-select", "random"], "--blend-select must be one of"),
        (["ingest", "{tmp}/missing", "--store", "{store}", "--source", "tiny-llama"], "missing"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(store, tmp_path, capsys, argv, expected):
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, store=store) for a in argv]
    assert main(argv) == 2
    assert expected in _error_line(capsys)


def test_store_from_another_source_is_refused_on_the_command_line(store, tiny_llama, tmp_path, capsys):
    from cagkit.models import LoadedModel, register_loaded

    register_loaded("cli-other", LoadedModel("cli-other", tiny_llama.model, tiny_llama.tokenizer, "cli-other-fp", True))
    capsys.readouterr()
    assert main(["ingest", str(tmp_path / "docs"), "--store", str(store), "--source", "cli-other",
                 "--chunk-tokens", "24", "--quiet"]) == 2
    line = _error_line(capsys)
    assert "built with source model 'tiny-llama'" in line and "--source tiny-llama" in line


def test_missing_translator_names_the_file_and_the_train_command(store, tiny_gemma, capsys):
    capsys.readouterr()
    assert main(["ask", "q?", "--store", str(store), "--model", "tiny-gemma"]) == 2
    line = _error_line(capsys)
    assert "tiny-llama__tiny-gemma" in line and "cagkit translators train" in line
