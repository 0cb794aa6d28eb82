"""The benchmark harness (`cagkit.bench`): results files with the run's description, timers, timed processes.
`ServerProcess` is exercised by tests/serve, whose servers it starts."""

from __future__ import annotations

import json
import sys

from cagkit.bench import Timer, run_timed, side_by_side, summary, write_results


def test_results_carry_the_command_date_and_machine_of_the_run_and_keep_their_own(tmp_path):
    out = tmp_path / "deep" / "results.json"
    results = {"rows": [1, 2], "command": "python mine.py --mine"}
    write_results(out, results, device="cpu")
    first = json.loads(out.read_text())
    assert first["rows"] == [1, 2] and first["command"] == "python mine.py --mine"  # the script's own command kept
    machine = first["machine"]
    assert machine["cpus"] >= 1 and machine["device"] == "cpu" and "torch" in machine and first["date"]
    results["rows"].append(3)
    write_results(out, results)  # a later save keeps the start's description
    again = json.loads(out.read_text())
    assert again["rows"] == [1, 2, 3] and again["date"] == first["date"] and again["machine"] == machine
    assert [p.name for p in out.parent.iterdir()] == ["results.json"]  # no temporary file left


def test_timer_and_timed_process():
    with Timer() as t:
        proc, seconds = run_timed([sys.executable, "-c", "print('hi')"])
    assert proc.returncode == 0 and proc.stdout == "hi\n"
    assert 0 < seconds <= t.seconds and t.ms == t.seconds * 1e3
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [3.0, 1.0, 2.0]}


def test_side_by_side_drops_the_warm_up_and_swaps_the_order_every_round():
    calls = []

    def run(way):
        calls.append(way)
        return float(len(calls)), f"{way} {len(calls)}"

    timing, last = side_by_side(run, ("a", "b"), repeats=2)
    assert calls == ["b", "a", "a", "b", "b", "a"]  # round 0 (warm-up) b first, then swapped each round
    assert timing["seconds"] == {"a": [3.0, 6.0], "b": [4.0, 5.0]}  # the warm-up's 1 and 2 dropped
    assert timing["median_s"] == {"a": 4.5, "b": 4.5} and timing["ratio"] == 1.0
    assert last == {"a": "a 6", "b": "b 5"}
    timing, _ = side_by_side(lambda way: (1.0 if way == "a" else 0.25, None), ("a", "b"), repeats=1)
    assert timing["ratio"] == 0.25  # the second way's median over the first's
