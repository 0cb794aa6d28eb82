"""Where models run: `--device` / `$CAGKIT_DEVICE`, and on CUDA the same results as on the CPU.

The CUDA tests run where PyTorch sees a GPU (skipped otherwise): each runs one step of cagkit on a tiny random
model on the CPU and on a copy of it on the GPU, in float32, and compares the results.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import make_tiny_gemma3, make_tiny_llama

from cagkit.ask import build_context_cache
from cagkit.cli import main
from cagkit.config import Placement
from cagkit.errors import ModelError
from cagkit.ingest.chunking import chunk_text
from cagkit.ingest.pipeline import prefill_chunks
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefill_kv, prefix_cache
from cagkit.kv.repair import blend
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import LoadedModel, register_loaded, resolve_device
from cagkit.store.store import Hit, NewChunk, Store, StoreSettings
from cagkit.translate.translator import Translator, TranslatorConfig, TranslatorNet

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TEXT = ("The lighthouse keeper counted 1,204 ships before the storm of '89 reached Ålesund. "
        "Her logbook, kept in copper ink, lists each ship by flag and by the hour it passed.")


def test_device_names_are_checked(monkeypatch):
    monkeypatch.delenv("CAGKIT_DEVICE", raising=False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("CAGKIT_DEVICE", "cpu")
    assert resolve_device(None) == torch.device("cpu")
    for bad in ("gpu", "tpu", "cuda:x"):
        with pytest.raises(ModelError, match=f"unknown device '{bad}'"):
            resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error(monkeypatch, capsys, tmp_path):
    with pytest.raises(ModelError, match="no CUDA GPU here; use --device cpu"):
        resolve_device("cuda")
    monkeypatch.setenv("CAGKIT_DEVICE", "cuda")
    with pytest.raises(ModelError, match="no CUDA GPU"):
        resolve_device(None)
    assert main(["ask", "--store", str(tmp_path / "s"), "--device", "bogus", "a question"]) == 2
    assert "unknown device 'bogus'" in capsys.readouterr().err


def on_cuda(lm: LoadedModel, name: str) -> LoadedModel:
    """A copy of `lm` on the GPU, loadable as `name`, with the same fingerprint (so it reads the same store)."""
    twin = LoadedModel(name, copy.deepcopy(lm.model).to("cuda"), lm.tokenizer, lm.fingerprint, lm.chat, lm.info)
    register_loaded(name, twin)
    return twin


@needs_cuda
def test_prefill_and_placement_on_cuda_match_the_cpu(tiny_gemma):
    gpu = on_cuda(tiny_gemma, "tiny-gemma-cuda")
    ids = tiny_gemma.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    on_cpu, on_gpu = prefill_kv(tiny_gemma.model, ids), prefill_kv(gpu.model, ids)
    assert on_gpu.keys.is_cuda
    torch.testing.assert_close(on_gpu.keys.cpu(), on_cpu.keys, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(on_gpu.values.cpu(), on_cpu.values, atol=1e-4, rtol=1e-4)
    logits = []
    for lm, kv in ((tiny_gemma, on_cpu), (gpu, on_cpu)):  # the GPU places KV that lives on the CPU, as stored
        cache = prefix_cache(lm.model, ids[:1])
        place_chunks(lm.model, cache, [kv])
        question = torch.tensor([ids[:5]], device=lm.device)
        logits.append(lm.model(input_ids=question, cache=cache, use_cache=True).logits[0, -1].cpu())
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)


@needs_cuda
def test_batched_ingest_prefill_on_cuda_matches_the_cpu(tiny_gemma):
    gpu = on_cuda(tiny_gemma, "tiny-gemma-cuda")
    chunks = chunk_text(TEXT * 4, tiny_gemma.count_tokens, 24)
    on_cpu = prefill_chunks(tiny_gemma, RotaryTables(tiny_gemma.model), chunks)  # one at a time
    on_gpu = prefill_chunks(gpu, RotaryTables(gpu.model), chunks)  # batched, as ingest does on a GPU
    assert len(on_gpu) == len(on_cpu) > 3
    for a, b in zip(on_gpu, on_cpu):
        assert a.kv.keys.is_cuda and a.token_ids == b.token_ids
        torch.testing.assert_close(a.kv.keys.cpu(), b.kv.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a.kv.values.cpu(), b.kv.values, atol=1e-4, rtol=1e-4)


@needs_cuda
def test_blend_on_cuda_matches_the_cpu(tiny_gemma):
    gpu = on_cuda(tiny_gemma, "tiny-gemma-cuda")
    ids = tiny_gemma.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    half = len(ids) // 2
    chunks = [prefill_kv(tiny_gemma.model, part) for part in (ids[:half], ids[half:])]
    out = [blend(lm.model, ids[:1], chunks, [ids[:half], ids[half:]], 0.4) for lm in (tiny_gemma, gpu)]
    for cpu_kv, gpu_kv in zip(*out):
        assert gpu_kv.keys.is_cuda
        torch.testing.assert_close(gpu_kv.keys.cpu(), cpu_kv.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(gpu_kv.values.cpu(), cpu_kv.values, atol=1e-4, rtol=1e-4)


@needs_cuda
def test_translation_on_cuda_matches_the_cpu(smollm2_tokenizer, gemma_tokenizer):
    source = LoadedModel("dev-src", make_tiny_llama(smollm2_tokenizer, layers=4), smollm2_tokenizer, "dev-src-fp",
                         False)
    target = LoadedModel("dev-tgt", make_tiny_gemma3(gemma_tokenizer, seed=1), gemma_tokenizer, "dev-tgt-fp", False)
    gpu = on_cuda(target, "dev-tgt-cuda")
    torch.manual_seed(0)
    net = TranslatorNet(TranslatorConfig.for_models("mot", source.model, target.model, width=32, expert_hidden=16,
                                                    token_dim=16))
    for expert in (e for layer in net.layers for e in layer.experts):
        torch.nn.init.normal_(expert[-1].weight, std=0.1)  # wake the experts so the routed path counts
    enc = source.tokenizer(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    kv = prefill_kv(source.model, enc["input_ids"])
    offsets = torch.tensor(enc["offset_mapping"])
    results = [Translator(copy.deepcopy(net), "dev-src-fp", "dev-tgt-fp", {}).translate(
        kv, enc["input_ids"], offsets, TEXT, lm) for lm in (target, gpu)]
    (cpu_kv, cpu_ids), (gpu_kv, gpu_ids) = results
    assert gpu_ids == cpu_ids and gpu_kv.keys.is_cuda
    torch.testing.assert_close(gpu_kv.keys.cpu(), cpu_kv.keys, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(gpu_kv.values.cpu(), cpu_kv.values, atol=1e-4, rtol=1e-4)


@needs_cuda
def test_a_store_built_on_the_cpu_answers_on_cuda(tiny_llama, tmp_path):
    """A store written on the CPU, its context built (reuse, then the deviation-chosen repair) on both devices:
    the same next-token logits. The store is written directly, so no sentence embedder is needed."""
    gpu = on_cuda(tiny_llama, "tiny-llama-cuda")
    settings = StoreSettings("tiny-llama", tiny_llama.fingerprint, "float16", 32, "none")
    parts = [TEXT[:80], TEXT[80:]]
    chunks = []
    for part in parts:
        enc = tiny_llama.tokenizer(part, add_special_tokens=False, return_offsets_mapping=True)
        chunks.append(NewChunk(part, 0, len(part), enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]],
                               prefill_kv(tiny_llama.model, enc["input_ids"])))
    with Store.open_for_writing(tmp_path / "s", settings) as store:
        store.write_document("log", "0" * 64, chunks, np.eye(len(chunks), 8, dtype=np.float32))
    with Store.open(tmp_path / "s") as store:
        hits = [Hit(i, "log", n, "", 1.0) for n, i in enumerate(store.chunk_ids("log"))]
        logits = []
        for lm in (tiny_llama, gpu):
            context = build_context_cache(lm, store, hits, "How many ships?", "mot",
                                          Placement(blend=0.3, blend_select="deviation"))
            assert context.mode == "reuse"
            pending = torch.tensor([context.pending_ids], device=lm.device)
            logits.append(lm.model(input_ids=pending, cache=context.cache, use_cache=True).logits[0, -1].cpu())
    torch.testing.assert_close(logits[1], logits[0], atol=1e-3, rtol=1e-3)
