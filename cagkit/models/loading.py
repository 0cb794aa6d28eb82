"""Load a model by alias, Hugging Face id or directory, with the facts about it that cagkit uses (`LoadedModel`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cagkit.errors import ModelError
from cagkit.models.identity import fingerprint
from cagkit.models.registry import KNOWN_MODELS, resolve


@dataclass
class LoadedModel:
    """A causal LM ready for prefill, with the facts about it that cagkit uses."""

    name: str
    model: object
    tokenizer: object
    fingerprint: str
    chat: bool
    info: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config.get_text_config()

    @property
    def device(self):
        """Where the model's weights live (and every tensor cagkit feeds it must be)."""
        from cagkit.models.device import model_device

        return model_device(self.model)

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        cfg = self.config
        return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


_LOADED: dict[tuple[str, str], LoadedModel] = {}
_REGISTERED: dict[str, LoadedModel] = {}


def resolve_device(device: str | None = None):
    """The torch device models run on: `device`, else `$CAGKIT_DEVICE`, else `auto` (CUDA when PyTorch sees a
    GPU, otherwise the CPU). Accepts `auto`, `cpu`, `cuda` and `cuda:N`."""
    import torch

    name = (device or os.environ.get("CAGKIT_DEVICE") or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except (RuntimeError, ValueError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ModelError(f"unknown device '{name}' (from --device or $CAGKIT_DEVICE); use auto, cpu, cuda or cuda:N")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(f"device '{name}' was asked for but PyTorch sees no CUDA GPU here; use --device cpu "
                             "(or auto), or install a CUDA build of torch")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelError(f"device '{name}' does not exist: PyTorch sees {torch.cuda.device_count()} GPU(s), "
                             f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return resolved


def flash_implementation(device) -> str | None:
    """transformers' flash-attention implementation for a model on `device`: `flash_attention_2` where the
    flash-attn package (FlashAttention-2, the `cagkit[gpu]` extra) is installed, else `flash_attention_4` where
    flash-attn-4 is, on CUDA only; None elsewhere, and where `$CAGKIT_ATTENTION` is `sdpa` (transformers'
    default attention, as on the CPU)."""
    import torch

    choice = (os.environ.get("CAGKIT_ATTENTION") or "auto").strip().lower()
    if choice not in ("auto", "sdpa"):
        raise ModelError(f"unknown attention '{choice}' (from $CAGKIT_ATTENTION); use auto or sdpa")
    if choice == "sdpa" or torch.device(device).type != "cuda":
        return None
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_4_available

    if is_flash_attn_2_available():
        return "flash_attention_2"
    if is_flash_attn_4_available():
        return "flash_attention_4"
    return None


def cpu_gqa_attention() -> None:
    """Let transformers' SDPA attention attend grouped-query heads in place under a mask on the CPU.

    By default transformers widens a GQA model's keys and values to one copy per query head (`repeat_kv`) whenever
    an attention mask is given, which it is for every prefill after a cache: a question over a placed document.
    That copy is much of the question's prefill over a long context (`benchmarks/gqa_prefill.py` times both ways
    side by side: docs/speed.md), and PyTorch's CPU kernels take the grouped heads as they are (`enable_gqa`), to
    the same output. transformers reads the switch, TRANSFORMERS_SDPA_FORCE_GQA, at every call; it is set for the
    process unless the environment sets it already (its CUDA kernels would fall back to the slow path with a mask,
    so it is set only when a model loads on the CPU)."""
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")


def load_model(name: str, device: str | None = None) -> LoadedModel:
    """Load a model by alias, Hugging Face id or directory (eval mode) onto `device` (see `resolve_device`);
    cached per process and device. fp32 with transformers' default attention (SDPA), except on CUDA where
    flash-attn is installed: bf16 through transformers' flash-attention implementation (`flash_implementation`;
    the fingerprint is that of the fp32 weights either way). A model made loadable with `register_loaded` is
    returned as registered, wherever it lives."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = resolve_device(device)
    key = (name, str(target))
    if key in _LOADED:
        return _LOADED[key]
    display, where = resolve(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    except OSError as exc:
        raise ModelError(f"cannot load model '{name}' from {where}: {exc}") from exc
    model.eval()
    info_file = Path(where) / "cagkit-model.json" if isinstance(where, Path) else None
    info = json.loads(info_file.read_text()) if info_file and info_file.exists() else {}
    spec = KNOWN_MODELS.get(name)
    loaded = LoadedModel(
        name=display,
        model=model,
        tokenizer=tokenizer,
        fingerprint=info.get("fingerprint") or fingerprint(model),
        chat=spec.chat if spec else tokenizer.chat_template is not None,
        info=info,
    )
    model.__dict__["_cagkit_fingerprint"] = loaded.fingerprint  # the key of its prompt prefix's KV kept on disk
    model.to(target)
    if target.type == "cpu":
        cpu_gqa_attention()
    flash = flash_implementation(target)
    if flash is not None:  # flash-attn computes in fp16 or bf16 only
        model.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        model.set_attn_implementation(flash)
    _LOADED[key] = loaded
    return loaded


def unload_model(name: str, device: str | None = None) -> None:
    """Forget the model `load_model(name, device)` keeps, so that its memory is freed once no caller holds it
    (`cagkit serve` keeps at most --max-loaded models). Registered models stay; an unknown name is a no-op."""
    _LOADED.pop((name, str(resolve_device(device))), None)


def register_loaded(name: str, loaded: LoadedModel) -> None:
    """Make an in-memory model loadable by `name` (tests use tiny random models this way)."""
    _REGISTERED[name] = loaded
