"""The pure parts of the long-context benchmark (benchmarks/ttft.py): context choice, token stream, cut points,
NLL, KL to native and recovery. No real models."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

_SPEC = importlib.util.spec_from_file_location("ttft_benchmark", Path(__file__).parents[1] / "benchmarks" / "ttft.py")
ttft = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ttft)


def test_context_chunk_count_takes_chunks_until_the_size_is_reached():
    assert ttft.context_chunk_count([100, 256, 256, 256], 512) == 3  # 612 >= 512
    assert ttft.context_chunk_count([100, 256, 256, 256], 356) == 2  # exactly reached
    assert ttft.context_chunk_count([100, 256], 10_000) == 2  # runs out of chunks


def test_join_chunks_and_truncated_lengths():
    ids, starts = ttft.join_chunks([[1, 2, 3], [4, 5], [6]], sep=[0, 0])
    assert ids == [1, 2, 3, 0, 0, 4, 5, 0, 0, 6]
    assert starts == [0, 5, 9]
    lengths = [3, 2, 1]
    assert ttft.truncated_lengths(starts, lengths, 7) == [3, 2, 0]  # end of the second chunk
    assert ttft.truncated_lengths(starts, lengths, 6) == [3, 1, 0]  # inside it
    assert ttft.truncated_lengths(starts, lengths, 4) == [3, 0, 0]  # inside a separator
    assert ttft.truncated_lengths(starts, lengths, 1) == [1, 0, 0]


def test_continuation_points_step_back_from_the_context_end():
    assert ttft.continuation_points(700, 64, 3) == [700, 636, 572]
    assert ttft.continuation_points(100, 64, 3) == [100, 36]  # none before position 1
    assert ttft.continuation_points(700, 64, 1) == [700]


def test_nll_and_kl():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]))
    assert ttft.nll(logp, [0, 1]) == pytest.approx(-(math.log(0.5) + math.log(0.8)) / 2)
    assert ttft.kl_from_native(logp, logp) == pytest.approx(0.0, abs=1e-7)
    uniform = torch.full((2, 3), -math.log(3))
    expected = sum(float((p * (p.log() + math.log(3))).sum()) for p in logp.exp()) / 2
    assert ttft.kl_from_native(logp, uniform) == pytest.approx(expected, rel=1e-5)
    assert ttft.kl_from_native(logp, uniform) > 0


def test_recovery():
    assert ttft.recovery(5.0, 4.0, 3.0) == pytest.approx(0.5)
    assert ttft.recovery(5.0, 3.0, 3.0) == pytest.approx(1.0)
    assert ttft.recovery(5.0, 5.0, 3.0) == pytest.approx(0.0)
    assert ttft.recovery(5.0, 2.0, 3.0) == pytest.approx(1.5)  # better than native
    assert ttft.recovery(4.0, 3.0, 4.0) is None  # no gap to recover


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
    rows = ttft.summary_rows(result)
    assert len(rows) == 1
    assert rows[0]["native"]["ttft_ms"] == 3000.0 and rows[0]["cagkit"]["ttft_ms"] == 900.0
    assert rows[0]["quality"]["nll"]["cagkit"] == 3.5
