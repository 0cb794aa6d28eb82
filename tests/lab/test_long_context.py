"""The pure parts of the long-context benchmark (`lab.long_context`, run by benchmarks/long_context.py): context choice,
token stream, cut points, recovery and the summary. No real models."""

from __future__ import annotations

import pytest

from lab import long_context


def test_context_chunk_count_takes_chunks_until_the_size_is_reached():
    assert long_context.context_chunk_count([100, 256, 256, 256], 512) == 3  # 612 >= 512
    assert long_context.context_chunk_count([100, 256, 256, 256], 356) == 2  # exactly reached
    assert long_context.context_chunk_count([100, 256], 10_000) == 2  # runs out of chunks


def test_join_chunks_and_truncated_lengths():
    ids, starts = long_context.join_chunks([[1, 2, 3], [4, 5], [6]], sep=[0, 0])
    assert ids == [1, 2, 3, 0, 0, 4, 5, 0, 0, 6]
    assert starts == [0, 5, 9]
    lengths = [3, 2, 1]
    assert long_context.truncated_lengths(starts, lengths, 7) == [3, 2, 0]  # end of the second chunk
    assert long_context.truncated_lengths(starts, lengths, 6) == [3, 1, 0]  # inside it
    assert long_context.truncated_lengths(starts, lengths, 4) == [3, 0, 0]  # inside a separator
    assert long_context.truncated_lengths(starts, lengths, 1) == [1, 0, 0]


def test_continuation_points_step_back_from_the_context_end():
    assert long_context.continuation_points(700, 64, 3) == [700, 636, 572]
    assert long_context.continuation_points(100, 64, 3) == [100, 36]  # none before position 1
    assert long_context.continuation_points(700, 64, 1) == [700]


def test_recovery():
    assert long_context.recovery(5.0, 4.0, 3.0) == pytest.approx(0.5)
    assert long_context.recovery(5.0, 3.0, 3.0) == pytest.approx(1.0)
    assert long_context.recovery(5.0, 5.0, 3.0) == pytest.approx(0.0)
    assert long_context.recovery(5.0, 2.0, 3.0) == pytest.approx(1.5)  # better than native
    assert long_context.recovery(4.0, 3.0, 4.0) is None  # no gap to recover


def test_summary_rows_join_ttft_and_quality():
    result = {
        "settings": {},
        "rows": [
            {"target": "gemma", "mode": "native", "size": 512, "context_tokens": 630, "ttft_ms": 3000.0},
            {"target": "gemma", "mode": "mot", "size": 512, "context_tokens": 620, "ttft_ms": 900.0},
            {"target": "gemma", "mode": "native", "size": 1024, "context_tokens": 1200, "error": "out of memory"},
        ],
        "quality": [{"target": "gemma", "size": 512, "nll": {"none": 4.0, "native": 3.0, "cagkit": 3.5}}],
    }
    rows = long_context.summary_rows(result)
    assert len(rows) == 1
    assert rows[0]["native"]["ttft_ms"] == 3000.0 and rows[0]["cagkit"]["ttft_ms"] == 900.0
    assert rows[0]["quality"]["nll"]["cagkit"] == 3.5
