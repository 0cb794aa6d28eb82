"""Where translator checkpoints live and what their JSON cards say, without PyTorch.

`cagkit translators list` and the paths other modules look checkpoints up by need only the file names and the cards,
so they live here, apart from the networks in `cagkit.translate.translator` (which imports the path and card helpers
it uses from here), and the command answers without loading PyTorch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from cagkit.errors import TranslatorError
from cagkit.files import write_json_atomic


def write_card(checkpoint: Path, card: dict) -> Path:
    """Write the JSON card of `checkpoint` atomically (the weights are not touched); returns the card's path."""
    return write_json_atomic(card_path(checkpoint), card)


def translators_dir() -> Path:
    """Where shipped translators live: `$CAGKIT_TRANSLATORS`, else `translators/` at the repository root."""
    env = os.environ.get("CAGKIT_TRANSLATORS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "translators"


def translator_path(source: str, target: str, kind: str = "mot") -> Path:
    suffix = ".safetensors" if kind == "mot" else f".{kind}.safetensors"
    return translators_dir() / f"{source}__{target}{suffix}"


def checkpoint_digest(checkpoint: Path) -> str:
    """The first 16 hex digits of a checkpoint file's sha256: what a results file records of the translator each
    method read, and what `cagkit translators answers` matches them by."""
    return hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()[:16]


def card_path(checkpoint: Path) -> Path:
    return Path(checkpoint).with_suffix(".json")


def read_card(checkpoint: Path, fix: str) -> dict:
    """The JSON card of `checkpoint`, {} when it has none; an unreadable one is refused with `fix` in the message."""
    card_file = card_path(checkpoint)
    try:
        return json.loads(card_file.read_text(encoding="utf-8")) if card_file.exists() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TranslatorError(f"translator card {card_file} is not readable JSON ({exc}); {fix}") from None


def train_command(source: str, target: str, kind: str = "mot") -> str:
    kind_flag = "" if kind == "mot" else f" --kind {kind}"
    return f"cagkit translators train --source {source} --target {target} --corpus ../shared/data/corpus{kind_flag}"


NEAR_NATIVE = 0.95  # the share of the no-context -> native gap a translated context closes to count as near native


def list_translators(directory: Path | None = None) -> list[dict]:
    """One row per checkpoint in `directory` (default `translators_dir()`), from its card alone (no weights are
    read): the pair, kind, training size and held-out recovery on next text and on recall, by loss and by KL.

    `near_native` says whether next-text recovery reaches `NEAR_NATIVE`: "yes" when both the loss and the KL to native
    do, "loss only" when the loss does but the KL does not (the translated context sharpened the prediction
    rather than reproducing the native one), else "no"; "unknown" when the card has no held-out scores.
    """
    given = directory
    directory = Path(directory) if directory else translators_dir()
    if not directory.is_dir():
        where = ("--dir" if given else "$CAGKIT_TRANSLATORS" if os.environ.get("CAGKIT_TRANSLATORS")
                 else "the shipped translators/ folder: cagkit finds it beside its package, so install cagkit "
                      "from its repository with `pip install -e .`, or point $CAGKIT_TRANSLATORS at a copy")
        raise TranslatorError(f"translator folder {directory} does not exist; check {where}")
    rows = []
    for path in sorted(directory.glob("*__*.safetensors")):
        pair, _, kind = path.name[: -len(".safetensors")].partition(".")
        source, _, target = pair.partition("__")
        card = read_card(path, f"restore it from git or retrain with `{train_command(source, target, kind or 'mot')}`")
        heldout = card.get("heldout") or {}
        recall = heldout.get("recall") or {}
        row = {
            "source": source, "target": target, "kind": kind or "mot", "path": str(path),
            "steps": card.get("steps"), "training_tokens": card.get("training_tokens"),
            "next_loss": (heldout.get("recovery") or {}).get("translated"),
            "next_kl": (heldout.get("kl_recovery") or {}).get("translated"),
            "recall_loss": (recall.get("recovery") or {}).get("translated"),
            "recall_kl": (recall.get("kl_recovery") or {}).get("translated"),
        }
        if row["next_loss"] is None or row["next_kl"] is None:
            row["near_native"] = "unknown"
        elif row["next_loss"] >= NEAR_NATIVE:
            row["near_native"] = "yes" if row["next_kl"] >= NEAR_NATIVE else "loss only"
        else:
            row["near_native"] = "no"
        rows.append(row)
    return rows
