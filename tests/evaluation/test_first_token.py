"""`cagkit bench`: the first-token benchmark runs end to end on a tiny model, its stored document cache gives
native prefill's first token, and it writes the results, the table and the page; bad options are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from cagkit.cli import main

TEXT = " ".join(f"The keeper of lamp {i} at Kerrow wrote {i * 3} lines in the log that night." for i in range(60))


def test_bench_on_a_tiny_model_writes_results_table_and_page(tiny_llama, tmp_path, capsys):
    text = tmp_path / "book.txt"
    text.write_text(TEXT)
    out, page = tmp_path / "r" / "bench.json", tmp_path / "docs" / "bench.md"
    args = ["bench", "--model", "tiny-llama", "--sizes", "48,96", "--repeats", "1", "--text", str(text),
            "--question", "How many lines did the keeper of lamp 3 write?", "--store", str(tmp_path / "st"),
            "--out", str(out), "--plot", "", "--report", str(page), "--threads", "1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [r["size"] for r in result["rows"]] == [48, 96] and result["settings"]["complete"]
    for row in result["rows"]:
        assert set(row["ttft_ms"]) == {"native", "stored", "select", "torch_save"}
        assert row["stored_equals_native"] and row["stored_equals_torch_save"]
        assert abs(row["document_tokens"] - row["size"]) < 20 and row["prefill"] == "document"
        assert row["measured_rounds"] == 1 and row["store_kv_bytes"] > 0
    assert result["machine"]["cpus"] >= 1 and "cagkit bench" in result["settings"]["command"]
    table = printed[printed.index("| tokens |"):]
    assert table.count("\n| ") == 2  # one row per size, under the header and its separator
    assert "| tokens |" in page.read_text() and "../r/bench.json" in page.read_text()
    # a rerun resumes: both sizes measured already, nothing loads or runs again
    assert main(args) == 0
    assert capsys.readouterr().out.count("measured already, skipped") == 2
    assert main(["bench", "--model", "tiny-llama", "--out", str(out), "--replot", "--plot", "", "--report", ""]) == 0
    # the same from an int4 store: its own store and file, a quarter of the KV bytes or so
    small = tmp_path / "r" / "bench-int4.json"
    assert main([*args[:args.index("--out")], "--out", str(small), "--plot", "", "--report", "", "--dtype", "int4",
                 "--sizes", "96", "--store", str(tmp_path / "st4")]) == 0
    (row,) = json.loads(small.read_text())["rows"]
    assert row["store_dtype"] == "int4" and row["store_kv_bytes"] < 0.6 * result["rows"][1]["store_kv_bytes"]


def test_a_half_done_size_keeps_its_torch_save_file_and_native_can_skip_the_warm_up(tiny_llama, tmp_path,
                                                                                    monkeypatch):
    from cagkit.evaluation import first_token

    text = tmp_path / "book.txt"
    text.write_text(TEXT)
    out = tmp_path / "bench.json"
    monkeypatch.chdir(tmp_path)  # the torch.save files go under results/bench-files/<model>
    args = ["bench", "--model", "tiny-llama", "--sizes", "48", "--repeats", "1", "--text", str(text), "--store",
            str(tmp_path / "st"), "--out", str(out), "--plot", "", "--report", "", "--threads", "1"]
    real_answer = first_token.load_and_answer

    def stop_after_the_file(*a, **k):  # the run stops once the baseline's file is written and ingest recorded
        raise KeyboardInterrupt

    monkeypatch.setattr(first_token, "load_and_answer", stop_after_the_file)
    assert main([*args, "--no-native-warm-up"]) != 0  # "interrupted; what was finished is kept"
    (half,) = json.loads(out.read_text())["rows"]
    assert half["partial"] and half["torch_save"]["bytes"] > 0 and half["ingest"]["tokens"] > 0
    saved = []
    real_save = first_token.save_cache
    monkeypatch.setattr(first_token, "save_cache", lambda *a, **k: saved.append(1) or real_save(*a, **k))
    monkeypatch.setattr(first_token, "load_and_answer", real_answer)
    assert main([*args, "--no-native-warm-up"]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert not saved and row["torch_save"] == half["torch_save"] and row["ingest"] == half["ingest"]
    warm_up, measured = row["rounds"]
    assert "native" not in warm_up and "native" in measured and row["stored_equals_native"]
    assert "--no-native-warm-up" in result["settings"]["command"] and result["settings"]["complete"]


def test_a_source_model_adds_the_translated_way_timed_beside_the_four(tiny_llama, tiny_gemma, tmp_path,
                                                                     monkeypatch, capsys):
    """With --source, the source ingests the document too and its KV, translated into --model, is a fifth way:
    timed in the same rounds, with the translation's time among its parts, in the file, the table and the page."""
    from cagkit.translate.translator import Translator, TranslatorConfig, TranslatorNet, translator_path

    monkeypatch.setenv("CAGKIT_TRANSLATORS", str(tmp_path / "translators"))
    torch.manual_seed(0)
    net = TranslatorNet(TranslatorConfig.for_models("linear", tiny_llama, tiny_gemma))
    Translator(net, tiny_llama.fingerprint, tiny_gemma.fingerprint, {}).save(
        translator_path("tiny-llama", "tiny-gemma", "linear"))
    text = tmp_path / "book.txt"
    text.write_text(TEXT)
    out, page = tmp_path / "bench.json", tmp_path / "bench.md"
    args = ["bench", "--model", "tiny-gemma", "--source", "tiny-llama", "--translator", "linear", "--sizes", "64",
            "--repeats", "1", "--text", str(text), "--store", str(tmp_path / "st"), "--source-store",
            str(tmp_path / "src"), "--out", str(out), "--plot", str(tmp_path / "bench.png"), "--report", str(page),
            "--threads", "1"]
    assert main(args) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    s = result["settings"]
    assert s["source"] == "tiny-llama" and s["translator"] == "linear" and len(s["translator_sha256"]) == 16
    assert set(row["ttft_ms"]) == {"native", "stored", "select", "torch_save", "translated"}
    assert all("translated" in r for r in row["rounds"]) and row["rounds"][1]["translated"]["mode"] == "linear"
    assert row["parts_ms"]["translated"]["translate_ms"] > 0 and row["ratio_to_native"]["translated"] > 0
    assert row["source_ingest"]["tokens"] > 0 and row["source_store_kv_bytes"] > 0 and row["stored_equals_native"]
    assert "--source tiny-llama --translator linear" in s["command"]
    assert "translated (tiny-llama, linear)" in page.read_text() and (tmp_path / "bench.png").stat().st_size > 0
    capsys.readouterr()
    # the same file cannot be resumed with another source or none; a missing checkpoint says how to get one
    assert main([a for a in args if a not in ("--source", "tiny-llama", "--translator", "linear")]) == 2
    assert "holds a run with source 'tiny-llama', not None" in capsys.readouterr().err
    assert main([*args[:args.index("--out")], "--out", str(tmp_path / "other.json"), "--translator", "mot"]) == 2
    err = capsys.readouterr().err
    assert "no mot translator from tiny-llama to tiny-gemma" in err and err.count("\n") == 1


@pytest.mark.parametrize("extra,words", [
    (["--sizes", "a,b"], "--sizes 'a,b': give document tokens as whole numbers"),
    (["--sizes", "8"], "each size must be at least 16 tokens"),
    (["--repeats", "0"], "--repeats must be 1 or more"),
    (["--text", "/nowhere/book.txt"], "text /nowhere/book.txt not found; pass --text FILE"),
    (["--replot", "--out", "/nowhere/r.json"], "/nowhere/r.json does not exist"),
    (["--source", "tiny-llama"], "--source tiny-llama is --model itself"),
])
def test_bad_bench_options_are_one_line_errors(extra, words, capsys):
    assert main(["bench", "--model", "tiny-llama", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
