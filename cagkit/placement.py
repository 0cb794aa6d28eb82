"""Ask-time options that trade speed for quality when stored chunks become a target's context.

Kept apart from `cagkit.ask` so that code reading results files (the report) can use it without loading torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from cagkit.errors import CagkitError

BLEND_SELECT = ("question", "deviation")


@dataclass(frozen=True)
class Placement:
    """How stored or translated chunks become the target's context: the ask-time trade of speed for quality.

    recompute_layers: translated modes only: the target recomputes its bottom this many layers over each chunk
        alone (about this share of a native prefill) and only the layers above are translated.
    blend: the share of context tokens the target recomputes through every layer with attention over all the
        retrieved chunks (`cagkit.blend`), after prefilling its bottom two layers over them jointly; it restores
        the cross-chunk attention that chunks stored one at a time never had. 0 = off, 1 = a joint prefill.
    blend_select: which tokens `blend` recomputes: `question` (whole sentences, most similar to the question
        first) or `deviation` (those whose layer-1 KV differs most from the joint prefill, as CacheBlend).

    The defaults (15% of the tokens, chosen by the question) are what the measurements in docs/measurements.md
    support for question answering: without them translated chunks carry the gist but not the exact spans.
    """

    recompute_layers: int = 0
    blend: float = 0.15
    blend_select: str = "question"

    def check(self, lm=None) -> None:
        """Refuse options out of range (for `lm`, a `cagkit.models.LoadedModel`, when given: without it the
        upper bound of --recompute-layers is not checked)."""
        if self.recompute_layers < 0:
            raise CagkitError(f"--recompute-layers must be 0 or more, got {self.recompute_layers}")
        if lm is not None and self.recompute_layers > lm.num_layers:
            raise CagkitError(f"--recompute-layers must be between 0 and {lm.num_layers} for {lm.name}, "
                              f"got {self.recompute_layers}")
        if not 0.0 <= self.blend <= 1.0:
            raise CagkitError(f"--blend must be a share of the context tokens between 0 and 1, got {self.blend}")
        if self.blend_select not in BLEND_SELECT:
            raise CagkitError(f"--blend-select must be one of {', '.join(BLEND_SELECT)}, got '{self.blend_select}'")

    def settings(self) -> dict:
        """Every option, for a results file or an answer (explicit, so a later change of defaults cannot
        change what a recorded run means)."""
        return asdict(self)

    def effective(self) -> "Placement":
        """The same placement with the options that have no effect reset (which tokens a blend of 0 would pick),
        so that two runs that place chunks the same way compare equal."""
        return self if self.blend else replace(self, blend_select=AS_STORED.blend_select)

    def describe(self) -> str:
        """What this placement adds to placing the chunks as stored, for a label: '' or e.g. ', blend 0.15 by
        question'."""
        parts = []
        if self.recompute_layers:
            parts.append(f"recompute layers {self.recompute_layers}")
        if self.blend:
            parts.append(f"blend {self.blend:g}" + (" by question" if self.blend_select == "question" else ""))
        return "".join(f", {p}" for p in parts)

    def inert_fields(self) -> tuple[str, ...]:
        """The options that have no effect under this placement: which tokens a blend of 0 would pick."""
        return () if self.blend else ("blend_select",)

    def cli_args(self) -> list[str]:
        """The `cagkit ask` / `cagkit eval` options that reproduce this placement (those not at the default)."""
        default = Placement()
        changed = {k: v for k, v in asdict(self).items() if v != getattr(default, k)}
        for name in self.inert_fields():
            changed.pop(name, None)
        return [arg for k, v in changed.items()
                for arg in (f"--{k.replace('_', '-')}", f"{v:g}" if isinstance(v, float) else str(v))]

    @classmethod
    def from_settings(cls, settings: dict) -> "Placement":
        """The placement recorded in a results file's settings or an answer. Files written before every option
        was recorded left out the ones at their defaults of the time, when chunks were placed as stored."""
        return cls(**{**asdict(AS_STORED), **{f.name: settings[f.name] for f in fields(cls) if f.name in settings}})


# Chunks placed exactly as stored or translated: no recompute of any kind (the fastest placement).
AS_STORED = Placement(recompute_layers=0, blend=0.0, blend_select="deviation")
PLACEMENT_FIELDS = tuple(f.name for f in fields(Placement))
