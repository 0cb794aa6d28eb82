"""Training translators, by concern: the paired-prefill data (`data`), the objective (`losses`), the closed-form
statistics and ridge fit (`ridge`), the loop and the end-to-end run (`loop`), held-out scoring (`heldout`).

`train_translator` and `score_translator` are what `cagkit translators train` and `score` call."""

from cagkit.translate.train.heldout import score_translator
from cagkit.translate.train.loop import train_translator

__all__ = ["score_translator", "train_translator"]
