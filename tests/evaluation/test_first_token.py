"""`cagkit bench`: the first-token benchmark runs end to end on a tiny model, its stored document cache gives
native prefill's first token, and it writes the results, the table and the page; bad options are one-line errors."""

from __future__ import annotations

import json

import pytest

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


@pytest.mark.parametrize("extra,words", [
    (["--sizes", "a,b"], "--sizes 'a,b': give document tokens as whole numbers"),
    (["--sizes", "8"], "each size must be at least 16 tokens"),
    (["--repeats", "0"], "--repeats must be 1 or more"),
    (["--text", "/nowhere/book.txt"], "text /nowhere/book.txt not found; pass --text FILE"),
    (["--replot", "--out", "/nowhere/r.json"], "/nowhere/r.json does not exist"),
])
def test_bad_bench_options_are_one_line_errors(extra, words, capsys):
    assert main(["bench", "--model", "tiny-llama", *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
