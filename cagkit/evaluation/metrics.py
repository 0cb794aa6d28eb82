"""Answer-quality metrics: SQuAD-style exact match and token F1, and closed-set answer parsing.

Free-form answers are compared after `normalize_answer` (the official SQuAD rule), and a
prediction scores the best value over all gold answers, as in SQuAD and QASPER.
"""

import math
import random
import re
import statistics
import string
from collections import Counter
from collections.abc import Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# "B", "(B)", "(B) text", "B. text", "B) text", "B: text"; a bare "A cat" is text, not a letter.
_LETTER = re.compile(r"\(?([A-Z])(?:[).:]|$)")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold answer, else 0.0."""
    _require_golds(golds)
    predicted = normalize_answer(prediction)
    return max(float(predicted == normalize_answer(gold)) for gold in golds)


def f1(prediction: str, golds: list[str]) -> float:
    """Token-overlap F1 of the normalized prediction against its best-matching gold answer."""
    _require_golds(golds)
    predicted = normalize_answer(prediction).split()
    return max(_token_f1(predicted, normalize_answer(gold).split()) for gold in golds)


def _token_f1(predicted: list[str], gold: list[str]) -> float:
    if not predicted or not gold:
        # SQuAD v2 rule: two empty answers agree, one empty answer scores zero.
        return float(predicted == gold)
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def _require_golds(golds: list[str]) -> None:
    # A question without gold answers is a loader bug; scoring it 0 would hide that.
    if not golds:
        raise ValueError("no gold answers to compare against")


def letter_or_text_to_index(answer: str, choices: list[str]) -> int | None:
    """Index into `choices` named by `answer`, or None if it names none of them.

    `answer` may be an option's text (compared normalized), or an upper-case letter:
    "B", "(B)", "(B) text", "B. text", "B) text". Used both to read gold answers
    (L-Eval, RACE) and to score closed-set predictions.
    """
    wanted = normalize_answer(answer)
    for index, choice in enumerate(choices):
        # A bare "A" normalizes to "" (article), so an empty answer never matches by text.
        if wanted and normalize_answer(choice) == wanted:
            return index
    match = _LETTER.match(answer.strip())
    if match is None:
        return None
    index = ord(match.group(1)) - ord("A")
    return index if index < len(choices) else None


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; raises ValueError (StatisticsError) when there are no values."""
    return float(statistics.fmean(values))


def median(values: Iterable[float]) -> float:
    """Median; raises ValueError (StatisticsError) when there are no values."""
    return float(statistics.median(values))


def paired_bootstrap(differences: list[float], resamples: int = 5000, level: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-question differences between two methods and its percentile bootstrap
    interval, resampling questions with replacement (seeded, so a report is reproducible)."""
    if not differences:
        raise ValueError("paired_bootstrap needs at least one difference")
    n = len(differences)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(differences, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low = means[int(tail * resamples)]
    high = means[min(resamples - 1, int((1 - tail) * resamples) - 1)]
    return sum(differences) / n, low, high


def gap_closed_bootstrap(gains: list[float], gaps: list[float], resamples: int = 5000, level: float = 0.95,
                         seed: int = 0) -> tuple[float, float, float] | None:
    """(share, low, high): the share of a gap a method closes, sum(gains) / sum(gaps), where per question `gains`
    is the method's score minus the baseline's and `gaps` the reference's minus the baseline's (native − select),
    with its percentile bootstrap interval over the questions resampled jointly (seeded). None when the gap over
    the questions is not positive (there is nothing to close); a resample without a positive gap counts at the
    interval's ends (a share of -inf or +inf as its gains fall), so an interval is never narrower than the data."""
    if len(gains) != len(gaps) or not gains:
        raise ValueError("gap_closed_bootstrap needs one gain and one gap per question")
    if sum(gaps) <= 0:
        return None
    n = len(gains)
    rng = random.Random(seed)
    shares = []
    for _ in range(resamples):
        picks = rng.choices(range(n), k=n)
        gap = sum(gaps[i] for i in picks)
        gain = sum(gains[i] for i in picks)
        shares.append(gain / gap if gap > 0 else math.copysign(math.inf, gain or -1.0))
    shares.sort()
    tail = (1 - level) / 2
    low = shares[int(tail * resamples)]
    high = shares[min(resamples - 1, int((1 - tail) * resamples) - 1)]
    return sum(gains) / sum(gaps), low, high
