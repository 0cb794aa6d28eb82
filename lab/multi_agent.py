"""The logic of the heterogeneous multi-agent benchmark (benchmarks/multi_agent.py), without models: which model
each agent runs, the two-round discussion protocol, the vote, and the accounting of the KV memory the agents keep.
The protocol and the accounting are described in full in benchmarks/multi_agent.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

MODEL_CYCLE = ("smollm2", "gemma", "qwen")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def agent_models(n: int, cycle: tuple[str, ...] = MODEL_CYCLE) -> list[str]:
    """The models of agents 0..n-1: agent i runs cycle[i % len(cycle)]."""
    return [cycle[i % len(cycle)] for i in range(n)]


def discussion_question(question: str, choices: list[str], other_picks: list[int]) -> str:
    """The round-2 input: the question with the other agents' round-1 picks appended, sorted by letter."""
    if not other_picks:
        return question
    said = "; ".join(f"({LETTERS[c]}) {choices[c]}" for c in sorted(other_picks))
    return f"{question}\nOther agents chose: {said}."


def majority_vote(picks: list[int], scores: list[list[float]]) -> int:
    """The most frequent pick; ties go to the highest sum of the agents' scores for the tied choices, then to
    the lowest choice index. `scores[a][c]` is agent a's score for choice c."""
    if not picks:
        raise ValueError("no picks to vote on")
    counts = Counter(picks)
    top = max(counts.values())
    tied = [c for c in counts if counts[c] == top]
    return max(sorted(tied), key=lambda c: sum(agent[c] for agent in scores))  # max keeps the first of equals


def discuss(models: list[str], question: str, choices: list[str],
            score: Callable[[str, str], list[float]]) -> dict:
    """Run the two-round discussion for agents with `models`; `score(model, text)` gives a model's choice scores.

    Returns the round-1 and round-2 picks, the round-1 majority and the group answer (round-2 majority).
    """
    first = [score(m, question) for m in models]
    picks1 = [_argmax(s) for s in first]
    second = []
    for i, m in enumerate(models):
        others = picks1[:i] + picks1[i + 1:]
        second.append(first[i] if not others else score(m, discussion_question(question, choices, others)))
    picks2 = [_argmax(s) for s in second]
    return {"picks1": picks1, "picks2": picks2,
            "round1_group": majority_vote(picks1, first), "group": majority_vote(picks2, second)}


def native_memory(models: list[str], kv_bytes: dict[str, int], tokens: dict[str, int]) -> dict:
    """Every agent keeps its own cache: `kv_bytes[m]` bytes per token of model m, `tokens[m]` the documents'
    tokens in m's tokenizer."""
    return {"bytes_per_context_token": sum(kv_bytes[m] for m in models),
            "total_bytes": sum(kv_bytes[m] * tokens[m] for m in models)}


def shared_memory(source_kv_bytes: int, source_tokens: int) -> dict:
    """One stored source cache for every agent, whatever their number."""
    return {"bytes_per_context_token": source_kv_bytes, "total_bytes": source_kv_bytes * source_tokens}


def transient_memory(models: list[str], kv_bytes: dict[str, int], largest_tokens: dict[str, int]) -> dict:
    """The in-cache copy each agent holds while it answers: the largest one agent's, and all agents' at once."""
    per_agent = [kv_bytes[m] * largest_tokens[m] for m in models]
    return {"transient_peak_agent_bytes": max(per_agent, default=0), "transient_all_agents_bytes": sum(per_agent)}


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)
