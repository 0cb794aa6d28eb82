"""The logic of the multi-agent benchmark (`lab.multi_agent`, run by benchmarks/multi_agent.py): agents, the
discussion protocol, voting and memory accounting."""

from __future__ import annotations

import pytest

from lab import multi_agent


def test_agents_cycle_through_the_models():
    assert multi_agent.agent_models(1) == ["smollm2"]
    assert multi_agent.agent_models(5) == ["smollm2", "gemma", "qwen", "smollm2", "gemma"]
    assert multi_agent.agent_models(8).count("qwen") == 2


def test_majority_vote_takes_the_most_frequent_pick():
    scores = [[0.0, -1.0, -2.0], [-5.0, -0.5, -1.0], [-3.0, -0.1, -2.0]]
    assert multi_agent.majority_vote([0, 1, 1], scores) == 1  # outvoted, although agent 0's score for 0 is the best


def test_majority_vote_breaks_ties_by_summed_scores():
    # 0 and 2 have one vote each; summed scores: choice 0 = -1.0 + -4.0 = -5.0, choice 2 = -3.0 + -0.5 = -3.5
    scores = [[-1.0, -9.0, -3.0], [-4.0, -9.0, -0.5]]
    assert multi_agent.majority_vote([0, 2], scores) == 2


def test_majority_vote_exact_tie_goes_to_the_earliest_choice():
    scores = [[-1.0, -2.0], [-2.0, -1.0]]
    assert multi_agent.majority_vote([1, 0], scores) == 0
    with pytest.raises(ValueError):
        multi_agent.majority_vote([], [])


def test_discussion_question_lists_other_picks_sorted_by_letter():
    choices = ["red", "green", "blue", "black"]
    text = multi_agent.discussion_question("Which colour?", choices, [2, 1, 1])
    assert text == "Which colour?\nOther agents chose: (B) green; (B) green; (C) blue."
    assert multi_agent.discussion_question("Which colour?", choices, []) == "Which colour?"


def test_discuss_runs_two_rounds_and_reuses_identical_inputs():
    choices = ["a", "b", "c", "d"]
    seen = []

    def score(model, text):
        seen.append((model, text))
        if "Other agents" not in text:  # round 1: smollm2 likes a, gemma and qwen like b
            return [0.0, -1.0, -2.0, -3.0] if model == "smollm2" else [-1.0, 0.0, -2.0, -3.0]
        return [-1.0, 0.0, -2.0, -3.0]  # round 2: everyone is persuaded by b

    one = multi_agent.discuss(["smollm2"], "q?", choices, score)
    assert one == {"picks1": [0], "picks2": [0], "round1_group": 0, "group": 0}  # nobody to discuss with
    assert len(seen) == 1

    three = multi_agent.discuss(multi_agent.agent_models(3), "q?", choices, score)
    assert three["picks1"] == [0, 1, 1] and three["round1_group"] == 1
    assert three["picks2"] == [1, 1, 1] and three["group"] == 1
    assert ("gemma", "q?\nOther agents chose: (A) a; (B) b.") in seen


def test_native_memory_grows_with_every_agent_and_the_store_does_not():
    kv = {"smollm2": 23040, "gemma": 18432, "qwen": 12288}
    tokens = {"smollm2": 1000, "gemma": 990, "qwen": 980}
    four = multi_agent.native_memory(multi_agent.agent_models(4), kv, tokens)
    assert four["bytes_per_context_token"] == 2 * 23040 + 18432 + 12288
    assert four["total_bytes"] == 2 * 23040 * 1000 + 18432 * 990 + 12288 * 980
    assert multi_agent.shared_memory(23040, 1000) == {"bytes_per_context_token": 23040, "total_bytes": 23040 * 1000}


def test_transient_memory_is_one_agents_cache_at_peak():
    kv = {"smollm2": 10, "gemma": 20, "qwen": 5}
    largest = {"smollm2": 100, "gemma": 90, "qwen": 80}
    got = multi_agent.transient_memory(multi_agent.agent_models(4), kv, largest)
    assert got == {"transient_peak_agent_bytes": 1800, "transient_all_agents_bytes": 1000 + 1800 + 400 + 1000}
    assert multi_agent.transient_memory([], kv, largest)["transient_peak_agent_bytes"] == 0
