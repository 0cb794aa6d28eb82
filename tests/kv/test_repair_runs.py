"""The repair's recomputed tokens attend through `cagkit.kv.attention` in runs of consecutive positions: the same
KV and the same answers as the one dense mask it replaces, SDPA on the CPU and on CUDA, flash-attn where CUDA
has it. The tiny random models here need no tokenizer, so every test also runs on a GPU machine."""

from __future__ import annotations

import pytest
import torch

import cagkit.kv.attention as attention_module
from cagkit.errors import ModelError
from cagkit.kv.attention import QueryRuns, attend_runs, flash_attn_available, reference_attention, route_query_runs
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefill_kv, prefix_cache
from cagkit.kv.repair import blend, runs_implementation
from cagkit.models.loading import flash_implementation, load_model, unload_model

VOCAB = 512
CHUNK_SIZES = (21, 17, 26)  # together longer than the tiny Gemma's 16-token sliding window


def _tiny(kind: str, seed: int = 0):
    """A small random model with head dim 64 (which every flash-attn generation takes)."""
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    torch.manual_seed(seed)
    common = dict(hidden_size=128, intermediate_size=256, vocab_size=VOCAB, max_position_embeddings=1024,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=64, **common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                                             **common))
    else:  # 5 sliding layers of 6 and two RoPE bases, like the real Gemma 3
        model = Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
                                                   head_dim=64, sliding_window=16, **common))
    return model.eval()


MODELS = ["llama", "qwen2", "gemma3"]


def _context(model, seed: int = 0):
    """A prefix, three chunks' token ids and their KV prefilled alone after a sink (as a store holds them)."""
    g = torch.Generator().manual_seed(seed)
    prefix = [1] + torch.randint(3, VOCAB, (3,), generator=g).tolist()
    chunk_ids = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in CHUNK_SIZES]
    alone = []
    for ids in chunk_ids:
        kv = prefill_kv(model, [1] + ids)
        alone.append(ChunkKV(kv.keys[:, 1:].cpu(), kv.values[:, 1:].cpu()))
    return prefix, chunk_ids, alone


SENTENCES = [(3, 11), (18, 27), (44, 52), (60, 64)]  # the second crosses from the first chunk into the second
SENTENCE_RATIO = sum(b - a for a, b in SENTENCES) / sum(CHUNK_SIZES)  # the budget takes exactly these


def _sentences_first() -> torch.Tensor:
    """A selection order that takes whole 'sentences' (runs of consecutive tokens) first."""
    order = torch.zeros(sum(CHUNK_SIZES))
    for rank, (a, b) in enumerate(SENTENCES):
        order[a:b] = 10.0 - rank - torch.arange(b - a) / 100  # earlier tokens first within a sentence
    return order


def _kv(chunks) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([c.keys for c in chunks], 1).float().cpu(), torch.cat([c.values for c in chunks], 1).float().cpu()


def _greedy(model, prefix, chunks, steps: int = 8) -> list[int]:
    """Greedy tokens after the prefix, the placed chunks and a short question."""
    device = next(model.parameters()).device
    cache = prefix_cache(model, prefix)
    place_chunks(model, cache, chunks)
    ids, out = [5, 6, 7], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=device), cache=cache, use_cache=True).logits
            ids = [int(logits[0, -1].argmax())]
            out.append(ids[0])
    return out


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class _Spy:
    """Counts the calls of `cagkit.kv.attention.attention` (and, with `flash`, of flash-attn's function)."""

    def __init__(self, monkeypatch, flash: bool = False):
        self.calls, self.flash_calls = 0, 0
        real = attention_module.attention

        def counted(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(attention_module, "attention", counted)
        if flash:
            func, version = attention_module._flash_attn()

            def flash_counted(*args, **kwargs):
                self.flash_calls += 1
                return func(*args, **kwargs)

            monkeypatch.setattr(attention_module, "_flash_attn", lambda: (flash_counted, version))


def test_query_runs_follow_consecutive_positions():
    # cache order: prefix 0..2, kept 3, 6, 9, then the recomputed 4, 5, 7, 8 appended last
    key_positions = torch.tensor([0, 1, 2, 3, 6, 9, 4, 5, 7, 8])
    plan = QueryRuns.of(key_positions, torch.tensor([4, 5, 7, 8]))
    assert plan.runs == ((0, 2, 6), (2, 4, 9))
    assert key_positions[plan.order].tolist() == list(range(10))
    assert QueryRuns.of(key_positions, torch.tensor([4, 7])).runs == ((0, 1, 5), (1, 2, 8))
    with pytest.raises(ValueError, match="exactly once"):
        QueryRuns.of(torch.tensor([0, 1, 1, 3]), torch.tensor([3]))


@pytest.mark.parametrize("window", [None, 4])
def test_attend_runs_matches_the_reference_per_query(window):
    g = torch.Generator().manual_seed(0)
    total, heads, kv_heads, dim = 12, 4, 2, 16
    positions = torch.tensor([3, 4, 5, 8, 10, 11])
    kept = torch.tensor([p for p in range(total) if p not in positions.tolist()])
    key_positions = torch.cat([kept, positions])
    k_pos = torch.randn(1, total, kv_heads, dim, generator=g)  # in position order
    v_pos = torch.randn(1, total, kv_heads, dim, generator=g)
    q = torch.randn(1, len(positions), heads, dim, generator=g)
    out = attend_runs(q, k_pos[:, key_positions], v_pos[:, key_positions], QueryRuns.of(key_positions, positions),
                      window)
    for i, p in enumerate(positions.tolist()):  # each query alone: the keys of positions 0..p
        expected = reference_attention(q[:, i:i + 1], k_pos[:, :p + 1], v_pos[:, :p + 1], True, window)
        torch.testing.assert_close(out[:, i:i + 1], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("select", ["sentences", "deviation"])
def test_repair_in_runs_equals_the_dense_mask(kind, select, monkeypatch):
    model = _tiny(kind)
    assert runs_implementation(model) == "sdpa"
    prefix, chunk_ids, alone = _context(model)
    priority, ratio = (_sentences_first(), SENTENCE_RATIO) if select == "sentences" else (None, 0.3)
    reference = blend(model, prefix, alone, chunk_ids, ratio, priority=priority, attention="mask")
    spy = _Spy(monkeypatch)
    repaired = blend(model, prefix, alone, chunk_ids, ratio, priority=priority)
    if select == "sentences":  # the default goes through cagkit.kv.attention, once per sentence and layer
        assert spy.calls == len(SENTENCES) * model.config.num_hidden_layers
    else:
        assert spy.calls >= model.config.num_hidden_layers
    for got, want in zip(_kv(repaired), _kv(reference)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert _relative(_kv(repaired)[0], _kv(alone)[0]) > 1e-3  # the repair did change something
    assert _greedy(model, prefix, repaired) == _greedy(model, prefix, reference)


def test_other_forwards_reach_the_routed_function_unchanged():
    model = _tiny("gemma3")
    ids = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(input_ids=ids).logits
        route_query_runs("sdpa")
        route_query_runs("sdpa")  # idempotent
        after = model(input_ids=ids).logits
        model.set_attn_implementation("eager")
        eager = model(input_ids=ids).logits
    torch.testing.assert_close(after, before)
    torch.testing.assert_close(after, eager, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot route"):
        route_query_runs("eager")


def test_eager_attention_keeps_the_dense_mask(monkeypatch):
    model = _tiny("llama")
    prefix, chunk_ids, alone = _context(model)
    reference = blend(model, prefix, alone, chunk_ids, 0.5, attention="mask")
    model.set_attn_implementation("eager")
    assert runs_implementation(model) is None
    spy = _Spy(monkeypatch)
    eager = blend(model, prefix, alone, chunk_ids, 0.5)  # auto: the mask
    assert spy.calls == 0
    for got, want in zip(_kv(eager), _kv(reference)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot attend in runs"):
        blend(model, prefix, alone, chunk_ids, 0.5, attention="runs")
    with pytest.raises(ValueError, match="unknown repair attention"):
        blend(model, prefix, alone, chunk_ids, 0.5, attention="flash")


def _saved_model(kind: str, folder) -> str:
    """`_tiny(kind)` saved as a model folder with a word-level tokenizer of its vocabulary (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", pad_token="w0", bos_token="w1",
                            eos_token="w2").save_pretrained(folder)
    _tiny(kind).save_pretrained(folder)
    return str(folder)


def test_load_model_keeps_fp32_and_sdpa_on_the_cpu(tmp_path):
    name = _saved_model("gemma3", tmp_path)
    loaded = load_model(name, "cpu")
    try:
        assert next(loaded.model.parameters()).dtype == torch.float32
        assert loaded.model.config._attn_implementation == "sdpa"
        assert runs_implementation(loaded.model) == "sdpa"
    finally:
        unload_model(name, "cpu")


def test_flash_implementation_only_on_cuda(monkeypatch):
    assert flash_implementation("cpu") is None
    monkeypatch.setenv("CAGKIT_ATTENTION", "sdpa")
    assert flash_implementation("cuda") is None
    monkeypatch.setenv("CAGKIT_ATTENTION", "triton")
    with pytest.raises(ModelError, match="CAGKIT_ATTENTION"):
        flash_implementation("cpu")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_flash = pytest.mark.skipif(not flash_attn_available("cuda"),
                                 reason="needs CUDA and flash-attn (pip install 'cagkit[gpu]' or flash-attn-4)")


@needs_cuda
@pytest.mark.parametrize("kind", MODELS)
def test_repair_in_runs_through_sdpa_on_cuda(kind, monkeypatch):
    """fp32 on CUDA with flash-attn kept out: the runs through SDPA equal the dense mask on CUDA and on the CPU."""
    monkeypatch.setattr(attention_module, "flash_attn_available", lambda device=None: False)
    model = _tiny(kind)
    prefix, chunk_ids, alone = _context(model)
    on_cpu = blend(model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=_sentences_first(), attention="mask")
    model.cuda()
    dense = blend(model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=_sentences_first(), attention="mask")
    spy = _Spy(monkeypatch)
    runs = blend(model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=_sentences_first())
    assert spy.calls == len(SENTENCES) * model.config.num_hidden_layers
    for got, want, cpu in zip(_kv(runs), _kv(dense), _kv(on_cpu)):
        print(f"\n{kind} sdpa-on-cuda runs vs dense mask: max abs {float((got - want).abs().max()):.3g}, "
              f"vs the CPU {float((got - cpu).abs().max()):.3g}")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got, cpu, atol=1e-4, rtol=1e-4)
    assert _greedy(model, prefix, runs) == _greedy(model, prefix, dense)


@needs_flash
@pytest.mark.parametrize("kind", MODELS)
def test_repair_through_flash_attn_on_cuda(kind, monkeypatch):
    """The target in bf16 through transformers' flash-attention implementation (as `load_model` sets it up on
    CUDA) and the repair's runs through flash-attn, against the dense-mask repair of the same bf16 weights
    through SDPA, and against the fp32 one on the CPU."""
    model = _tiny(kind)
    prefix, chunk_ids, alone = _context(model)
    order = _sentences_first()
    on_cpu = blend(model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=order, attention="mask")
    model.cuda().to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    dense = blend(model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=order, attention="mask")
    implementation = flash_implementation("cuda")
    assert implementation in ("flash_attention_2", "flash_attention_4")
    model.set_attn_implementation(implementation)
    assert runs_implementation(model) == implementation
    spy = _Spy(monkeypatch, flash=True)
    repaired = blend(model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=order)
    assert spy.flash_calls == len(SENTENCES) * model.config.num_hidden_layers
    for name, got, want, cpu in zip(("keys", "values"), _kv(repaired), _kv(dense), _kv(on_cpu)):
        print(f"\n{kind} {implementation} {name}: vs bf16 SDPA dense mask max abs "
              f"{float((got - want).abs().max()):.3g} relative {_relative(got, want):.3g}; vs fp32 CPU max abs "
              f"{float((got - cpu).abs().max()):.3g} relative {_relative(got, cpu):.3g} "
              f"(largest {float(cpu.abs().max()):.3g})")
        assert _relative(got, want) < 1e-2
        assert _relative(got, cpu) < 5e-2


@needs_flash
def test_load_model_on_cuda_attends_through_flash_attention(tmp_path):
    """On CUDA with flash-attn, `load_model` gives a bf16 model with transformers' flash-attention implementation
    and the fingerprint of its fp32 weights, and the repair's runs go through flash-attn."""
    name = _saved_model("llama", tmp_path)
    on_cpu = load_model(name, "cpu")
    loaded = load_model(name, "cuda")
    try:
        assert next(loaded.model.parameters()).dtype == torch.bfloat16 and loaded.device.type == "cuda"
        assert loaded.model.config._attn_implementation == flash_implementation("cuda")
        assert loaded.fingerprint == on_cpu.fingerprint
        prefix, chunk_ids, alone = _context(on_cpu.model)
        reference = blend(on_cpu.model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=_sentences_first())
        repaired = blend(loaded.model, prefix, alone, chunk_ids, SENTENCE_RATIO, priority=_sentences_first())
        for got, want in zip(_kv(repaired), _kv(reference)):
            assert _relative(got, want) < 5e-2
    finally:
        unload_model(name, "cpu")
        unload_model(name, "cuda")


@needs_flash
@pytest.mark.parametrize("kind", MODELS)
def test_target_through_transformers_flash_attention_on_cuda(kind):
    """A bf16 forward through transformers' flash-attention implementation gives SDPA's logits."""
    model = _tiny(kind).cuda().to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    ids = torch.randint(3, VOCAB, (1, 80), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        sdpa = model(input_ids=ids).logits.float()
        model.set_attn_implementation(flash_implementation("cuda"))
        flash = model(input_ids=ids).logits.float()
    print(f"\n{kind} logits flash vs sdpa (bf16): max abs {float((flash - sdpa).abs().max()):.3g}, "
          f"relative {_relative(flash, sdpa):.3g}")
    assert _relative(flash, sdpa) < 2e-2
