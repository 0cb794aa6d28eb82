"""Translators on tiny random models: layer-0 exactness, routing, ridge, training, files and refusals.

The source is a 4-layer Llama with the real SmolLM2 tokenizer, the target a 6-layer Gemma 3 (sliding windows,
two RoPE bases) with the real Gemma tokenizer, so alignment between two different tokenizations is exercised.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from conftest import make_tiny_gemma3, make_tiny_llama
from safetensors import safe_open
from safetensors.torch import save_file

from cagkit.config import TrainSettings
from cagkit.errors import TranslatorError
from cagkit.files import default_file_mode
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefill_kv, prefix_cache, sink_ids
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import LoadedModel, register_loaded
from cagkit.translate.alignment import align
from cagkit.translate.cards import card_path
from cagkit.translate.train import heldout, loop, score_translator, train_translator
from cagkit.translate.train.data import (
    TrainingData,
    generate_data,
    qa_continuation,
    qa_passages,
    recall_continuation,
)
from cagkit.translate.train.heldout import evaluate_translator
from cagkit.translate.train.loop import _config_key
from cagkit.translate.train.losses import (
    batch_losses,
    context_correction,
    top_bins_kl,
)
from cagkit.translate.train.ridge import fit_ridge, fit_statistics
from cagkit.translate.translator import (
    LayerTranslator,
    Translator,
    TranslatorConfig,
    TranslatorNet,
    embedding_layer_kv,
    load_translator,
    read_translator,
    token_features,
    translator_path,
)
from lab.heldout import diagnostics

SIZES = {"width": 32, "expert_hidden": 16, "token_dim": 16}
LINEAR_SIZES = {"token_dim": 16}  # a ridge map has no trunk or experts to size
TEXT = "The lighthouse keeper counted 1,204 ships — naïvely — before the storm of '89 reached Ålesund."


@pytest.fixture(scope="module")
def pair(smollm2_tokenizer, gemma_tokenizer):
    source = LoadedModel(name="tiny-src", model=make_tiny_llama(smollm2_tokenizer, layers=4),
                         tokenizer=smollm2_tokenizer, fingerprint="src-fp", chat=False)
    target = LoadedModel(name="tiny-tgt", model=make_tiny_gemma3(gemma_tokenizer, seed=1),
                         tokenizer=gemma_tokenizer, fingerprint="tgt-fp", chat=False)
    register_loaded("tiny-src", source)
    register_loaded("tiny-tgt", target)
    return source, target


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    words = ("river stone lantern orchard whisper copper meadow harbour signal winter candle ledger "
             "falcon thimble quarry saddle").split()
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(9)) + "." for i in range(400)]
    (root / "training").mkdir()
    (root / "testing").mkdir()
    (root / "training" / "a.txt").write_text("\n".join(lines[:300]))
    (root / "testing" / "b.txt").write_text("\n".join(lines[300:]))
    return root


def tiny_settings(**changes) -> TrainSettings:
    base = TrainSettings(steps=40, prefix_tokens=24, heldout_prefix_tokens=24, continuation_tokens=8, examples=8,
                         shard_size=4, batch=4,
                         lr=3e-3, warmup=5, top_logits=16, checkpoint_every=20, heldout_examples=2, sizes=SIZES)
    return dataclasses.replace(base, **changes)


def source_chunk(source, text):
    enc = source.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return prefill_kv(source.model, enc["input_ids"]), enc["input_ids"], torch.tensor(enc["offset_mapping"])


def test_source_windows_follow_depth():
    cfg = TranslatorConfig(kind="mot", source_layers=30, source_kv_dim=192, target_layers=18, target_heads=1,
                           target_head_dim=256, target_embed_dim=640)
    windows = [cfg.source_window(t) for t in range(18)]
    assert windows[0] == [0, 1, 2] and windows[-1] == [27, 28, 29]
    assert all(len(w) == 3 and w == list(range(w[0], w[0] + 3)) for w in windows)
    assert all(a[0] <= b[0] for a, b in zip(windows, windows[1:]))
    assert 8 in cfg.source_window(5)  # layer 5 of 18 sits at 29% depth, source layer 8.5 of 30


def test_embedding_layer_kv_equals_a_native_prefill(pair):
    for model in pair:
        ids = model.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
        native = prefill_kv(model.model, ids)
        keys, values = embedding_layer_kv(model.model, torch.tensor(ids))
        assert torch.allclose(keys, native.keys[0], atol=1e-5)
        assert torch.allclose(values, native.values[0], atol=1e-5)


def _gated_sum(layer, x):
    """The output of a 4-expert, top-2 `layer` on x [N, 12 source + 8 token features], written out row by row:
    its skip plus each chosen expert's output on the trunk output, gated."""
    h = layer.trunk(torch.cat([layer.skip[0](x[:, :12]), x[:, 12:]], dim=-1))
    top_p, top_i = torch.softmax(layer.router(h), dim=-1).topk(2, dim=-1)
    expected = layer.skip(x[:, :12])
    for n in range(len(x)):
        for p, e in zip(top_p[n] / top_p[n].sum(), top_i[n]):
            expected[n] += p * layer.experts[int(e)](h[n])
    return expected


def test_router_output_is_the_gated_sum_of_its_top_k_experts():
    torch.manual_seed(0)
    cfg = TranslatorConfig(kind="mot", source_layers=4, source_kv_dim=8, target_layers=3, target_heads=1,
                           target_head_dim=4, target_embed_dim=8, num_experts=4, top_k=2, **SIZES)
    layer = LayerTranslator(cfg, source_dim=12, in_dim=20)
    for expert in layer.experts:  # wake the experts, which start silent
        torch.nn.init.normal_(expert[-1].weight)
    x = torch.randn(50, 20)
    y, balance = layer(x)
    assert torch.allclose(y, _gated_sum(layer, x), atol=1e-5)
    assert 1.0 <= balance.item() <= 4.0  # 1 when balanced, E when one expert takes everything
    layer.dense_experts = True  # every expert on every row (the GPU's way) gives the same output and balance
    dense, dense_balance = layer(x)
    assert torch.allclose(dense, y, atol=1e-5) and dense_balance.item() == pytest.approx(balance.item())
    layer.dense_experts = None
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.bias.zero_()
    _, uniform = layer(x)
    assert uniform.item() == pytest.approx(1.0, abs=1e-5)


def test_ridge_recovers_a_known_linear_map():
    torch.manual_seed(0)
    cfg = TranslatorConfig(kind="linear", source_layers=4, source_kv_dim=6, target_layers=3, target_heads=2,
                           target_head_dim=3, target_embed_dim=8, window=2)
    net = TranslatorNet(cfg)  # statistics stay at mean 0, std 1: normalised == raw
    source = torch.randn(20, 16, 4, 12)  # [B, P, Ls, 2Fs]
    target_kv = torch.zeros(20, 16, 3, 12)  # [B, P, Lt, 2Ft]; layer 0 is native, not fitted
    truth = []
    for i, window in enumerate(net.windows):
        w, b = torch.randn(12, 24), torch.randn(12)
        truth.append((w, b))
        target_kv[:, :, 1 + i] = source[:, :, window].flatten(2) @ w.T + b
    errors = fit_ridge(net, {"source": source, "target_kv": target_kv}, ridge=1e-6)
    for layer, (w, b) in zip(net.layers, truth):
        assert torch.allclose(layer.head.weight, w, atol=1e-4)
        assert torch.allclose(layer.head.bias, b, atol=1e-4)
    assert errors["kv"] < 1e-8


def test_mot_starts_as_the_rank_truncated_ridge_map():
    """A mot translator's skip is fitted by ridge and its experts start silent: a rank-r map is recovered."""
    torch.manual_seed(0)
    cfg = TranslatorConfig(kind="mot", source_layers=4, source_kv_dim=6, target_layers=3, target_heads=2,
                           target_head_dim=3, target_embed_dim=8, window=2, skip_rank=3, **SIZES)
    net = TranslatorNet(cfg)
    source = torch.randn(20, 16, 4, 12)  # [B, P, Ls, 2Fs]
    tokens = torch.randn(20, 16, 16)  # [B, P, 2E]
    target_kv = torch.zeros(20, 16, 3, 12)
    for i, window in enumerate(net.windows):
        low_rank = torch.randn(12, 3) @ torch.randn(3, 24)  # rank 3
        target_kv[:, :, 1 + i] = source[:, :, window].flatten(2) @ low_rank.T + torch.randn(12)
    errors = fit_ridge(net, {"source": source, "target_kv": target_kv}, ridge=1e-6)
    assert errors["kv"] < 1e-8
    with torch.no_grad():
        pred, _ = net(source, tokens)
    assert torch.allclose(pred, target_kv[:, :, 1:], atol=1e-3)


def test_training_reduces_the_loss(pair, corpus, tmp_path):
    source, target = pair
    settings = tiny_settings()
    cfg = TranslatorConfig.for_models("mot", source, target, **SIZES)
    data = generate_data(source, target, corpus, settings, cfg.align_mode, tmp_path / "data", log=lambda m: None).all()
    assert data["source"].shape == (8, 24, 4, 2 * 2 * 16)  # [N, P, Ls, 2 * Hs * Ds]
    assert data["target_kv"].shape == (8, 24, 6, 2 * 1 * 32)
    path = train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "t.safetensors", work_dir=tmp_path,
                            settings=settings, log=lambda m: None)
    trained = read_translator(path)
    fresh = TranslatorNet(cfg)
    fresh.load_state_dict({k: v for k, v in trained.net.state_dict().items() if k.endswith(("_mean", "_std"))},
                          strict=False)
    tables = RotaryTables(target.model)
    with torch.no_grad():
        before = batch_losses(fresh.eval(), target, data, settings, tables)
        after = batch_losses(trained.net, target, data, settings, tables)
    assert after["loss"] < 0.8 * before["loss"]
    assert after["kv"] < before["kv"] and after["kl"] < before["kl"]
    card = trained.card
    assert card["steps"] == 40 and card["target"]["fingerprint"] == "tgt-fp"
    assert set(card["heldout"]["nll"]) >= {"none", "native", "translated"}
    assert card["heldout"]["kl_to_native"]["native"] == pytest.approx(0.0, abs=1e-4)
    assert card["heldout"]["recall"]["kl_to_native"]["native"] == pytest.approx(0.0, abs=1e-4)
    assert card["heldout"]["recall"]["kl_to_native"]["none"] > 0


def test_training_data_streams_from_its_shards_as_if_in_memory(pair, corpus, tmp_path):
    """Batches, statistics and the ridge fit read shard by shard give what the stacked data gives."""
    source, target = pair
    settings = tiny_settings()  # 8 examples in 2 shards
    cfg = TranslatorConfig.for_models("mot", source, target, **SIZES)
    data = generate_data(source, target, corpus, settings, cfg.align_mode, tmp_path / "data", log=lambda m: None)
    assert isinstance(data, TrainingData) and len(data) == 8 and data.sizes == [4, 4]
    stacked = data.all()
    assert data.tokens == stacked["ids"].numel() == 8 * 24
    pick = torch.tensor([6, 1, 6, 3])  # across both shards, one twice
    batch = data.batch(pick)
    assert set(batch) == set(stacked)
    for key, value in batch.items():
        assert torch.equal(value, stacked[key][pick]), key
    torch.manual_seed(0)
    streamed = TranslatorNet(cfg)
    torch.manual_seed(0)
    whole = TranslatorNet(cfg)
    fit_statistics(streamed, data)
    fit_statistics(whole, stacked)
    assert torch.allclose(streamed.source_std, stacked["source"].float().flatten(0, 1).std(0).clamp(min=1e-4),
                          rtol=1e-4, atol=1e-6)
    errors = fit_ridge(streamed, data, settings.ridge), fit_ridge(whole, stacked, settings.ridge)
    assert errors[0]["kv"] == pytest.approx(errors[1]["kv"], rel=1e-6)
    for name in ("source_mean", "source_std", "target_mean", "target_std"):
        assert torch.allclose(getattr(streamed, name), getattr(whole, name), rtol=1e-5, atol=1e-6), name
    tokens = token_features(target.model, stacked["ids"])
    with torch.no_grad():
        pred, _ = streamed(stacked["source"].float(), tokens)
        assert torch.allclose(pred, whole(stacked["source"].float(), tokens)[0], rtol=1e-4, atol=1e-4)
        direct = (pred - streamed.normalise_target(stacked["target_kv"][:, :, cfg.native_layers:].float())).pow(2)
    # the error from the accumulated sums is the mean squared residual of the map as set (experts start silent)
    assert errors[0]["kv"] == pytest.approx(float(direct.mean()), rel=1e-3)





def test_continuation_nll_and_kl_to_native():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]))
    assert heldout.nll(logp, [0, 1]) == pytest.approx(-(math.log(0.5) + math.log(0.8)) / 2)
    assert heldout.kl_from_native(logp, logp) == pytest.approx(0.0, abs=1e-7)
    uniform = torch.full((2, 3), -math.log(3))
    expected = sum(float((p * (p.log() + math.log(3))).sum()) for p in logp.exp()) / 2
    assert heldout.kl_from_native(logp, uniform) == pytest.approx(expected, rel=1e-5)
    assert heldout.kl_from_native(logp, uniform) > 0


def test_swapping_halves_scores_native_keys_and_native_values(pair, corpus, monkeypatch):
    """A translator that gets the keys exactly right and the values all zero: with native keys it scores what
    it scores alone, and with native values it scores what native does."""
    source, target = pair
    translator = _rounded_translator(pair, "mot")
    sink, tables = sink_ids(target), RotaryTables(target.model)
    real = translator.translate

    def keys_only(source_kv, source_ids, offsets, text, model):
        _, ids = real(source_kv, source_ids, offsets, text, model)
        native = prefill_kv(target.model, sink + ids, tables)
        return ChunkKV(native.keys[:, len(sink):], torch.zeros_like(native.values[:, len(sink):])), ids

    monkeypatch.setattr(translator, "translate", keys_only)
    scores = evaluate_translator(translator, source, target, corpus, tiny_settings(),
                                 variants=diagnostics(target, swap_halves=True))
    for task in (scores, scores["recall"]):
        nll = task["nll"]
        assert nll["native_keys"] == pytest.approx(nll["translated"], abs=1e-5)
        assert nll["native_values"] == pytest.approx(nll["native"], abs=1e-5)
        assert nll["translated"] != pytest.approx(nll["native"], abs=1e-3)


def test_native_layer_sets_take_exactly_those_layers_from_the_native_prefill(pair, corpus):
    """Every layer native scores what native scores, no layer native what the translation scores, and one
    translated layer among native ones lies in between."""
    source, target = pair
    translator = _rounded_translator(pair, "mot")
    every = tuple(range(target.num_layers))
    sets = {"all": every, "none_native": (), "last_translated": every[:-1]}
    scores = evaluate_translator(translator, source, target, corpus, tiny_settings(),
                                 variants=diagnostics(target, native_layer_sets=sets))
    for task in (scores, scores["recall"]):
        nll, kl = task["nll"], task["kl_to_native"]
        assert nll["all"] == pytest.approx(nll["native"], abs=1e-5) and kl["all"] == pytest.approx(0.0, abs=1e-5)
        assert nll["none_native"] == pytest.approx(nll["translated"], abs=1e-5)
        assert 0 < kl["last_translated"] < kl["translated"]
    with pytest.raises(ValueError, match="layer 99"):
        evaluate_translator(translator, source, target, corpus, tiny_settings(),
                            variants=diagnostics(target, native_layer_sets={"x": (99,)}))


def test_repaired_contexts_run_from_the_translation_to_a_full_prefill(pair, corpus):
    """Held-out scores after the cross-chunk repair: recomputing every token is the target's own prefill, so it
    scores what native scores; a partial repair of an untrained translator lies between it and native."""
    source, target = pair
    translator = _rounded_translator(pair, "mot")
    scores = evaluate_translator(translator, source, target, corpus, tiny_settings(),
                                 variants=diagnostics(target, repair_ratios=(0.5, 1.0)))
    for task in (scores, scores["recall"]):
        nll, kl = task["nll"], task["kl_to_native"]
        assert nll["repaired_1"] == pytest.approx(nll["native"], abs=1e-4)
        assert kl["repaired_1"] == pytest.approx(0.0, abs=1e-4)
        assert kl["translated"] > 1e-3  # an untrained translator is far from native
        assert kl["repaired_0.5"] < kl["translated"]


def test_recall_examples_replay_a_span_of_their_own_prefix(pair, corpus, tmp_path):
    source, target = pair
    assert recall_continuation(list(range(10)), 4, 3) == [3, 4, 5, 6]
    assert recall_continuation(list(range(10)), 4, 9) == [6, 7, 8, 9]  # clamped so the span fits
    data = generate_data(source, target, corpus, tiny_settings(recall_fraction=1.0), "cover", tmp_path / "r",
                         log=lambda m: None).all()
    plain = generate_data(source, target, corpus, tiny_settings(recall_fraction=0.0), "cover", tmp_path / "p",
                          log=lambda m: None).all()
    assert torch.equal(data["ids"], plain["ids"])  # the same passages
    for ids, continuation in zip(data["ids"].tolist(), data["continuation"].tolist()):
        assert any(ids[i: i + len(continuation)] == continuation for i in range(len(ids) - len(continuation) + 1))
    assert not torch.equal(data["continuation"], plain["continuation"])


@pytest.fixture(scope="module")
def qa_file(tmp_path_factory):
    """A SQuAD file of two articles: the first one's questions are the ones `--qa-skip 1` leaves out."""
    def paragraph(words, answer):
        return " ".join(words) + f" The keeper lived in {answer}. " + " ".join(reversed(words)) + "."

    first = "river stone lantern orchard whisper copper meadow harbour signal winter candle ledger".split()
    second = "falcon thimble quarry saddle orchard lantern copper winter river stone signal meadow".split()
    articles = []
    for name, words, places in (("A", first, ["Ålesund", "Bergen"]), ("B", second, ["Tromsø", "Oslo"])):
        paragraphs = [{"context": paragraph(words * 3, place), "qas": [
            {"id": f"{name}{i}", "question": f"Where did keeper {name}{i} live?", "is_impossible": False,
             "answers": [{"text": place, "answer_start": 0}]}]} for i, place in enumerate(places)]
        articles.append({"title": name, "paragraphs": paragraphs})
    path = tmp_path_factory.mktemp("qa") / "qa.json"
    path.write_text(json.dumps({"version": "v2.0", "data": articles}), encoding="utf-8")
    return path


def test_question_answer_examples_ask_about_a_passage_that_holds_the_answer(pair, corpus, qa_file, tmp_path):
    source, target = pair
    settings = tiny_settings(qa_data=str(qa_file), qa_fraction=1.0, qa_skip=1, continuation_tokens=24)
    items = qa_passages(settings, target)
    assert {answer for _, _, answer in items} == {"Tromsø", "Oslo"}  # article A is left out
    data = generate_data(source, target, corpus, settings, "cover", tmp_path / "qa", log=lambda m: None).all()
    tok = target.tokenizer
    for ids, continuation, mask in zip(data["ids"].tolist(), data["continuation"].tolist(), data["mask"].tolist()):
        real = tok.decode([t for t, keep in zip(continuation, mask) if keep])
        question, answer = real.split("\nAnswer: ")
        assert question.startswith("\n\nQuestion: Where did keeper B") and answer in ("Tromsø", "Oslo")
        assert answer in tok.decode(ids)  # the answer lies within the translated prefix
        assert 0 < sum(mask) < len(mask) and mask == sorted(mask, reverse=True)  # padded at the end only
    plain = generate_data(source, target, corpus, tiny_settings(), "cover", tmp_path / "plain", log=lambda m: None)
    assert "mask" not in plain.all()  # data made without --qa is as before
    with pytest.raises(TranslatorError, match="--qa-skip 4 leaves none of the 4 questions"):
        qa_passages(tiny_settings(qa_data=str(qa_file), qa_fraction=1.0, qa_skip=4), target)
    with pytest.raises(TranslatorError, match="no question whose answer is found"):
        qa_passages(tiny_settings(qa_data=str(qa_file), qa_fraction=1.0, prefix_tokens=4000), target)


def test_a_question_answer_continuation_is_the_asks_prompt_then_the_answer(smollm2_tokenizer, gemma_tokenizer):
    """An instruct target reads the rest of its chat turn (as `cagkit ask` prompts it), a base target the plain
    'Question/Answer' prompt; one too long keeps its end, so the answer is always there."""
    from types import SimpleNamespace

    from cagkit.generation import prompt_parts

    chat = SimpleNamespace(tokenizer=smollm2_tokenizer, chat=True)
    suffix = prompt_parts(chat, "Where did the keeper live?")[1]
    answer = smollm2_tokenizer("Ålesund", add_special_tokens=False)["input_ids"]
    ids, mask = qa_continuation(chat, "Where did the keeper live?", "Ålesund", len(suffix) + len(answer) + 3)
    assert ids[: len(suffix) + len(answer)] == suffix + answer and mask.tolist() == [True] * (len(ids) - 3) + [False] * 3
    short, mask = qa_continuation(chat, "Where did the keeper live?", "Ålesund", 8)
    assert short == (suffix + answer)[-8:] and bool(mask.all())
    base = SimpleNamespace(tokenizer=gemma_tokenizer, chat=False)
    ids, mask = qa_continuation(base, "Where?", "Ålesund", 16)
    assert gemma_tokenizer.decode(ids[: int(mask.sum())]) == "\n\nQuestion: Where?\nAnswer: Ålesund"


def test_padding_of_a_question_answer_continuation_is_left_out_of_the_losses(pair, corpus, qa_file, tmp_path):
    """Whatever the padded positions hold, the CCL reads only the real tokens; over the native cache it vanishes,
    as for corpus continuations."""
    source, target = pair
    settings = tiny_settings(qa_data=str(qa_file), qa_fraction=1.0, qa_skip=1, continuation_tokens=24)
    cfg = TranslatorConfig.for_models("mot", source, target, **SIZES)
    data = generate_data(source, target, corpus, settings, cfg.align_mode, tmp_path / "qa", log=lambda m: None).all()
    tables = RotaryTables(target.model)
    with torch.no_grad():
        kl, hidden = context_correction(target, data["target_kv"].float(), data, cfg, tables)
        assert kl.item() == pytest.approx(0, abs=1e-6) and hidden.item() == pytest.approx(0, abs=1e-4)
        kv = data["target_kv"].float().flip(0)  # another example's cache: the losses are far from 0
        garbled = dict(data)
        padding = ~data["mask"]
        garbled["hidden"] = data["hidden"].masked_fill(padding[:, None, :, None], 1e3)
        garbled["top_logits"] = data["top_logits"].masked_fill(padding[..., None], 50.0)
        wanted = context_correction(target, kv, data, cfg, tables)
        for got, want in zip(context_correction(target, kv, garbled, cfg, tables), wanted):
            assert got.item() == pytest.approx(want.item(), rel=1e-5) and want.item() > 0
        unmasked = {key: value for key, value in garbled.items() if key != "mask"}  # the garbage would count
        for got, want in zip(context_correction(target, kv, unmasked, cfg, tables), wanted):
            assert got.item() != pytest.approx(want.item(), rel=0.1)


def test_training_with_question_answer_continuations_is_recorded_and_checked(pair, corpus, qa_file, tmp_path):
    settings = tiny_settings(steps=2, qa_data=str(qa_file), qa_fraction=0.5, qa_skip=1)
    path = train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "t.safetensors", work_dir=tmp_path,
                            settings=settings, log=lambda m: None)
    recorded = read_translator(path).card["settings"]
    assert (recorded["qa_data"], recorded["qa_fraction"], recorded["qa_skip"]) == (str(qa_file), 0.5, 1)
    cfg = TranslatorConfig.for_models("mot", *pair, **SIZES)
    assert _config_key(cfg, settings) != _config_key(cfg, tiny_settings(steps=2))
    assert _config_key(cfg, settings) != _config_key(cfg, dataclasses.replace(settings, qa_skip=0))
    for bad, message in (({"qa_fraction": 0.5}, "--qa-fraction needs a question-answering file"),
                         ({"qa_data": str(tmp_path / "missing.json"), "qa_fraction": 0.5}, "missing.json: no such file"),
                         ({"qa_data": str(qa_file), "qa_fraction": 1.5}, "--qa-fraction 1.5 is not a share"),
                         ({"qa_data": str(qa_file), "qa_fraction": 0.5, "qa_skip": -1}, "--qa-skip -1 is negative"),
                         ({"qa_skip": 200}, "--qa-skip and --qa-format shape question-answer continuations")):
        with pytest.raises(TranslatorError, match=message):
            train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "u.safetensors", work_dir=tmp_path,
                             settings=tiny_settings(**bad), log=lambda m: None)


def test_top_bins_kl_is_the_kl_of_the_coarsened_distributions():
    torch.manual_seed(0)
    native, translated = torch.randn(2, 3, 50) * 3, torch.randn(2, 3, 50) * 3
    top = native.topk(8, dim=-1)
    got = top_bins_kl(top.values, native.logsumexp(-1), top.indices, translated)

    def bins(logits):  # [..., 9]: the 8 native top tokens, then everything else
        p = logits.softmax(-1)
        inside = p.gather(-1, top.indices)
        return torch.cat([inside, 1 - inside.sum(-1, keepdim=True)], dim=-1)

    p, q = bins(native), bins(translated)
    assert got.item() == pytest.approx((p * (p / q).log()).sum(-1).mean().item(), rel=1e-4)
    assert top_bins_kl(top.values, native.logsumexp(-1), top.indices, native).item() == pytest.approx(0, abs=1e-5)
    # mass moved off the native top tokens: the renormalised top-K KL cannot see it, this one does
    elsewhere = native.scatter(-1, top.indices, float("-inf")).clamp(min=-1e4) + 5
    shifted = torch.where(torch.isinf(native.scatter(-1, top.indices, float("-inf"))), native, elsewhere)
    renormalised = (shifted.gather(-1, top.indices).log_softmax(-1) - top.values.log_softmax(-1)).abs().max()
    assert renormalised.item() < 1e-5
    assert top_bins_kl(top.values, native.logsumexp(-1), top.indices, shifted).item() > 0.1


@pytest.mark.parametrize("full_vocab", [False, True])
def test_context_correction_is_zero_on_the_native_cache(pair, corpus, tmp_path, full_vocab):
    """Replaying over the target's own stored KV gives the stored native trajectory: both KLs (top-K renormalised
    and whole-vocabulary) and the hidden-state loss vanish, so the stored log-partition matches the replay."""
    source, target = pair
    settings = tiny_settings(full_vocab_kl=full_vocab)
    cfg = TranslatorConfig.for_models("mot", source, target, **SIZES)
    data = generate_data(source, target, corpus, settings, cfg.align_mode, tmp_path / "data", log=lambda m: None).all()
    assert ("logsumexp" in data) is full_vocab
    with torch.no_grad():
        kl, hidden = context_correction(target, data["target_kv"].float(), data, cfg, RotaryTables(target.model))
        wrong = context_correction(target, data["target_kv"].float().flip(0), data, cfg, RotaryTables(target.model))
    assert kl.item() == pytest.approx(0, abs=1e-6) and hidden.item() == pytest.approx(0, abs=1e-4)
    # another example's cache is far from it (the tiny random target spreads its mass almost evenly over the
    # 262k-token vocabulary, so every KL here is small)
    assert wrong[0] > 100 * kl and wrong[1] > 100 * hidden


def test_without_the_context_correction_loss_the_target_replay_keeps_no_graph(pair, corpus, tmp_path):
    """--ccl-weight 0 (the KV-loss-only ablation): the CCL's parts are still measured, but no backward pass goes
    through the target's replay, so its gradients reach the translator from the KV loss alone."""
    source, target = pair
    cfg = TranslatorConfig.for_models("mot", source, target, **SIZES)
    data = generate_data(source, target, corpus, tiny_settings(), cfg.align_mode, tmp_path / "data",
                         log=lambda m: None).all()
    net, tables = TranslatorNet(cfg), RotaryTables(target.model)
    fit_statistics(net, data)
    with_ccl = batch_losses(net, target, data, tiny_settings(), tables)
    kv_only = batch_losses(net, target, data, tiny_settings(kl_weight=0.0, hidden_weight=0.0), tables)
    assert with_ccl["kl"].requires_grad and with_ccl["hidden"].requires_grad
    assert not kv_only["kl"].requires_grad and not kv_only["hidden"].requires_grad
    assert kv_only["kl"].item() == pytest.approx(with_ccl["kl"].item(), rel=1e-5)  # measured all the same
    # the KV-only loss is the KV loss plus the load balance, nothing from the replay
    assert kv_only["loss"].item() == pytest.approx((kv_only["kv"] + 0.01 * kv_only["balance"]).item(), rel=1e-5)
    kv_only["loss"].backward()
    assert all(p.grad is None for p in target.model.parameters())


def test_training_on_one_loss_alone_and_on_none(pair, corpus, tmp_path):
    path = train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "t.safetensors", work_dir=tmp_path,
                            settings=tiny_settings(steps=3, kl_weight=0.0, hidden_weight=0.0), log=lambda m: None)
    settings = read_translator(path).card["settings"]
    assert (settings["kv_weight"], settings["kl_weight"], settings["hidden_weight"]) == (1.0, 0.0, 0.0)
    with pytest.raises(TranslatorError, match="--kv-weight or --ccl-weight"):
        train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "u.safetensors", work_dir=tmp_path,
                         settings=tiny_settings(kv_weight=0.0, kl_weight=0.0, hidden_weight=0.0), log=lambda m: None)


def test_a_corpus_without_heldout_or_training_text_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    """The held-out files are needed only for the card's scores at the end; a corpus without them must fail at
    the start, not after the data and the training steps."""
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded for a corpus that cannot be trained on")

    monkeypatch.setattr(loop, "load_model", no_loading)
    train_only, heldout_only = tmp_path / "train-only", tmp_path / "heldout-only"
    (train_only / "books").mkdir(parents=True)
    (train_only / "books" / "a.txt").write_text("Some text to train on.\n")
    (heldout_only / "testing").mkdir(parents=True)
    (heldout_only / "testing" / "b.txt").write_text("Some text held out.\n")
    for corpus, message in ((train_only, "no held-out .txt files; held-out text goes under a testing/"),
                            (heldout_only, "no training .txt files"),
                            (tmp_path / "nowhere", "is not a folder")):
        with pytest.raises(TranslatorError, match=message):
            train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "u.safetensors", work_dir=tmp_path,
                             settings=tiny_settings(), log=lambda m: None)


def test_sizes_a_kind_ignores_are_refused_before_any_model_loads(corpus, tmp_path, monkeypatch):
    """`--kind linear --width 320` used to train a plain ridge map after the data was built, and say nothing."""
    monkeypatch.setattr(loop, "load_model", lambda *a, **k: pytest.fail("a model was loaded for bad sizes"))
    for kind, sizes, message in (("linear", SIZES, "--width, --expert-hidden would change nothing"),
                                 ("projector", {"num_experts": 2}, "for --kind mot")):
        with pytest.raises(TranslatorError, match=message):
            train_translator("tiny-src", "tiny-tgt", corpus, kind=kind, out=tmp_path / "u.safetensors",
                             work_dir=tmp_path, settings=tiny_settings(sizes=sizes), log=lambda m: None)


def test_training_prefix_length_and_seed_are_apart_from_the_heldout_ones(pair, corpus, tmp_path):
    """Other training prefixes or seeds change the data and the state, never the held-out passages the card is
    scored on."""
    settings = tiny_settings(steps=2, prefix_tokens=32)
    path = train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "t.safetensors", work_dir=tmp_path,
                            settings=settings, log=lambda m: None)
    card = read_translator(path).card
    assert card["settings"]["prefix_tokens"] == 32
    assert card["training_tokens"] == 32 * settings.examples
    assert card["heldout"]["prefix_tokens"] == 24
    cfg = TranslatorConfig.for_models("mot", *pair, **SIZES)
    assert _config_key(cfg, settings) != _config_key(cfg, tiny_settings(steps=2))
    assert _config_key(cfg, settings) == _config_key(cfg, dataclasses.replace(settings, heldout_prefix_tokens=64))
    # another seed trains on other passages, from another state, but is scored on the same held-out ones
    reseeded = train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "s.safetensors", work_dir=tmp_path,
                                settings=dataclasses.replace(settings, seed=1), log=lambda m: None)
    other = read_translator(reseeded).card
    assert other["heldout"]["nll"]["none"] == pytest.approx(card["heldout"]["nll"]["none"])
    assert other["heldout"]["nll"]["translated"] != pytest.approx(card["heldout"]["nll"]["translated"])
    assert _config_key(cfg, settings) != _config_key(cfg, dataclasses.replace(settings, seed=1))
    with pytest.raises(TranslatorError, match="--prefix-tokens 4 is shorter than the 8-token continuation"):
        train_translator("tiny-src", "tiny-tgt", corpus, out=tmp_path / "u.safetensors", work_dir=tmp_path,
                         settings=tiny_settings(prefix_tokens=4), log=lambda m: None)


def test_training_with_the_whole_vocabulary_kl(pair, corpus, tmp_path):
    logs = []
    path = train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=4, full_vocab_kl=True),
                            out=tmp_path / "t.safetensors", work_dir=tmp_path, log=logs.append)
    assert read_translator(path).card["settings"]["full_vocab_kl"] is True
    assert [d.name for d in tmp_path.glob("data-*")] == ["data-cover-p24c8k16-lse-r0.5-seed0"]  # its own data
    assert any(line.startswith("step 4/4") for line in logs)


def test_overlap_alignment_trains_on_its_own_data_and_is_recorded(pair, corpus, tmp_path):
    path = train_translator("tiny-src", "tiny-tgt", corpus, kind="linear",
                            settings=tiny_settings(sizes={**LINEAR_SIZES, "align_mode": "overlap"}),
                            out=tmp_path / "t.safetensors", work_dir=tmp_path, log=lambda m: None)
    assert read_translator(path).net.cfg.align_mode == "overlap"
    assert [d.name for d in tmp_path.glob("data-*")] == ["data-overlap-p24c8k16-r0.5-seed0"]


def test_score_rescores_an_old_card_without_touching_the_weights(pair, corpus, tmp_path, capsys):
    from cagkit.cli import main

    path = train_translator("tiny-src", "tiny-tgt", corpus, kind="linear", settings=tiny_settings(sizes=LINEAR_SIZES),
                            out=tmp_path / "t.safetensors", work_dir=tmp_path, log=lambda m: None)
    weights = path.read_bytes()
    trained = json.loads(card_path(path).read_text())["heldout"]
    card = json.loads(card_path(path).read_text())
    del card["heldout"]["recall"]  # a card scored before recall was
    card["corpus"] = str(tmp_path / "moved")
    card_path(path).write_text(json.dumps(card))
    with pytest.raises(TranslatorError, match="moved.*--corpus"):
        score_translator(path)
    assert main(["translators", "score", str(path), "--corpus", str(corpus)]) == 0
    assert "card updated" in capsys.readouterr().out
    rescored = json.loads(card_path(path).read_text())
    assert path.read_bytes() == weights
    assert rescored["heldout"]["recall"]["nll"] == pytest.approx(trained["recall"]["nll"])
    assert rescored["heldout"]["nll"] == pytest.approx(trained["nll"])
    assert rescored["heldout_scored"]["corpus"] == str(corpus)
    assert rescored["steps"] == card["steps"] and rescored["settings"] == card["settings"]
    with pytest.raises(TranslatorError, match="nowhere.safetensors does not exist"):
        score_translator(tmp_path / "nowhere.safetensors")
    card_path(path).unlink()  # a checkpoint without its card cannot say which models it is for
    with pytest.raises(TranslatorError, match=r"t\.json does not name the models"):
        score_translator(path)


def _refuse_fitting(monkeypatch):
    """Make the statistics and ridge fits fail: a run that has its weights already must not spend time on them."""
    def refuse(*args, **kwargs):
        raise AssertionError("fitted again although the weights were given")

    monkeypatch.setattr(loop, "fit_statistics", refuse)
    monkeypatch.setattr(loop, "fit_ridge", refuse)


def test_training_resumes_where_it_stopped(pair, corpus, tmp_path, monkeypatch):
    logs = []
    common = dict(out=tmp_path / "t.safetensors", work_dir=tmp_path, log=logs.append)
    train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=20, checkpoint_every=10), **common)
    logs.clear()
    _refuse_fitting(monkeypatch)  # the saved state holds the statistics and the ridge initialisation
    train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=30, checkpoint_every=10), **common)
    assert "resumed at step 20/30" in logs
    assert not any(line.startswith("data shard") for line in logs)  # the shards were reused
    assert read_translator(tmp_path / "t.safetensors").card["steps"] == 30


def test_an_interrupted_run_resumed_ends_as_an_uninterrupted_one(pair, corpus, tmp_path, monkeypatch):
    def stop_at_step_20(line):
        if line.startswith("step 20/"):
            raise KeyboardInterrupt  # as Ctrl-C would, after the step-10 checkpoint and before the step-20 one

    settings = dict(steps=30, checkpoint_every=10)
    with pytest.raises(KeyboardInterrupt):
        train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(**settings),
                         out=tmp_path / "a" / "t.safetensors", work_dir=tmp_path / "a", log=stop_at_step_20)
    logs = []
    with monkeypatch.context() as patched:
        _refuse_fitting(patched)
        resumed = read_translator(train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(**settings),
                                                   out=tmp_path / "a" / "t.safetensors", work_dir=tmp_path / "a",
                                                   log=logs.append))
    assert "resumed at step 10/30" in logs
    straight = read_translator(train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(**settings),
                                                out=tmp_path / "b" / "t.safetensors", work_dir=tmp_path / "b",
                                                log=lambda line: None))
    for key, value in straight.net.state_dict().items():
        torch.testing.assert_close(resumed.net.state_dict()[key], value, msg=key)
    # the losses' moving averages are part of the saved state, so the card reports what the straight run's does
    assert resumed.card["final_losses"] == pytest.approx(straight.card["final_losses"])


def test_fine_tuning_starts_from_the_given_checkpoint_with_its_own_settings(pair, corpus, tmp_path, monkeypatch):
    logs = []
    first = train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=10),
                             out=tmp_path / "a.safetensors", work_dir=tmp_path, log=logs.append)
    logs.clear()
    with monkeypatch.context() as patched:
        _refuse_fitting(patched)  # the checkpoint brings its own statistics and weights
        tuned = train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=0, kv_weight=0.5),
                                 init=first, out=tmp_path / "b.safetensors", work_dir=tmp_path, log=logs.append)
    assert f"starting from {first} (10 steps)" in logs
    before, after = read_translator(first), read_translator(tuned)
    for key, value in before.net.state_dict().items():  # no step taken: the weights are the start's
        assert torch.equal(value, after.net.state_dict()[key]), key
    assert after.card["initialised_from"]["steps"] == 10 and after.card["settings"]["kv_weight"] == 0.5
    logs.clear()
    train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=5, kv_weight=0.5),
                     init=first, out=tmp_path / "c.safetensors", work_dir=tmp_path, log=logs.append)
    assert any(line.startswith("step 5/5") for line in logs)
    with pytest.raises(TranslatorError, match="not a projector translator"):
        train_translator("tiny-src", "tiny-tgt", corpus, settings=tiny_settings(steps=1), kind="projector",
                         init=first, out=tmp_path / "d.safetensors", work_dir=tmp_path, log=logs.append)


def _rounded_translator(pair, kind: str, **sizes) -> Translator:
    """An untrained translator whose weights are fp16-representable, so a file round trip is exact."""
    source, target = pair
    torch.manual_seed(0)
    net = TranslatorNet(TranslatorConfig.for_models(kind, source, target,
                                                    **{**(LINEAR_SIZES if kind == "linear" else SIZES), **sizes}))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(p.half().float())
    return Translator(net, source.fingerprint, target.fingerprint, {"kind": kind})


@pytest.mark.parametrize("kind", ["mot", "projector", "linear"])
def test_translate_layout_and_file_round_trip(pair, tmp_path, monkeypatch, kind):
    source, target = pair
    monkeypatch.setenv("CAGKIT_TRANSLATORS", str(tmp_path))
    translator = _rounded_translator(pair, kind)
    kv, ids, offsets = source_chunk(source, TEXT)
    out, target_ids = translator.translate(kv, ids, offsets, TEXT, target)
    assert target_ids == target.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert out.keys.shape == out.values.shape == (6, len(target_ids), 1, 32)  # [Lt, Tt, Ht, Dt]
    native = prefill_kv(target.model, target_ids)
    assert torch.allclose(out.keys[0], native.keys[0], atol=1e-5)  # layer 0 is exact, not translated
    half, _ = translator.translate(ChunkKV(kv.keys.half(), kv.values.half()), ids, offsets, TEXT, target)
    assert torch.allclose(half.keys, out.keys, atol=1e-2, rtol=1e-2)

    written = translator.save(translator_path("tiny-src", "tiny-tgt", kind))
    assert written.stat().st_mode & 0o777 == default_file_mode()  # not safetensors' owner-only 0600
    loaded = load_translator("tiny-src", "src-fp", target, kind)
    again, _ = loaded.translate(kv, ids, offsets, TEXT, target)
    assert loaded.kind == kind and loaded.card == {"kind": kind}
    assert torch.equal(again.keys, out.keys) and torch.equal(again.values, out.values)

    cache = prefix_cache(target.model, sink_ids(target))
    place_chunks(target.model, cache, [again])
    assert cache.get_seq_length() == len(sink_ids(target)) + len(target_ids)


def test_translating_chunks_together_equals_one_at_a_time(pair):
    source, target = pair
    translator = _rounded_translator(pair, "mot")
    for expert in (e for layer in translator.net.layers for e in layer.experts):
        torch.nn.init.normal_(expert[-1].weight, std=0.1)  # wake the experts so routing counts
    texts = [TEXT, "Short one.", " ", "Zweite Zeile: Größe 3 µm."]
    chunks = [(*source_chunk(source, text), text) for text in texts]
    together = translator.translate_many(chunks, target)
    assert [len(ids) for _, ids in together] == [len(target.tokenizer(t, add_special_tokens=False)["input_ids"])
                                                 for t in texts]
    for (kv, ids), chunk in zip(together, chunks):
        alone, alone_ids = translator.translate(*chunk, target)
        assert ids == alone_ids
        torch.testing.assert_close(kv.keys, alone.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.values, alone.values, atol=1e-5, rtol=1e-5)


class _Shape:
    """A stand-in for a loaded model: just a config."""

    class config:
        num_hidden_layers, num_key_value_heads, head_dim, hidden_size, num_attention_heads = 4, 1, 4, 8, 2


def test_translator_sizes_shape_the_layers_and_bad_sizes_are_refused():
    cfg = TranslatorConfig.for_models("mot", _Shape(), _Shape(), width=12, expert_hidden=10, num_experts=6, top_k=3)
    layer = TranslatorNet(cfg).layers[0]
    assert (len(layer.experts), layer.top_k, layer.trunk[0].out_features) == (6, 3, 12)
    assert layer.experts[0][0].out_features == 10
    projector = TranslatorConfig.for_models("projector", _Shape(), _Shape(), expert_hidden=10)
    assert (projector.num_experts, projector.top_k, projector.expert_hidden) == (1, 1, 10)
    with pytest.raises(TranslatorError, match="top-k 5 is more than the 4 experts"):
        TranslatorConfig.for_models("mot", _Shape(), _Shape(), top_k=5)
    with pytest.raises(TranslatorError, match="translator width 0 must be 1 or more"):
        TranslatorConfig.for_models("mot", _Shape(), _Shape(), width=0)
    with pytest.raises(TranslatorError, match="translator window 0 must be 1 or more"):
        TranslatorConfig.for_models("projector", _Shape(), _Shape(), window=0)
    assert TranslatorNet(TranslatorConfig.for_models("projector", _Shape(), _Shape(), window=2)).windows.shape == (3, 2)
    with pytest.raises(TranslatorError, match="for --kind mot"):
        TranslatorConfig.for_models("projector", _Shape(), _Shape(), num_experts=4)
    with pytest.raises(TranslatorError, match="a linear translator .* --width, --expert-hidden would change nothing"):
        TranslatorConfig.for_models("linear", _Shape(), _Shape(), width=12, expert_hidden=10)
    assert TranslatorConfig.for_models("linear", _Shape(), _Shape(), window=2).window == 2  # a window it reads


def test_resumable_state_keys_stay_those_of_earlier_runs():
    """A training state's key is what earlier versions computed for the same run (the keys below are those of
    e9a2574, the last commit with the removed designs), so their states still resume; what shapes a run changes it."""
    cfg = TranslatorConfig(kind="mot", source_layers=4, source_kv_dim=8, target_layers=6, target_heads=2,
                           target_head_dim=4, target_embed_dim=16)
    assert _config_key(cfg, TrainSettings()) == "3a33fcdcd0"
    assert _config_key(cfg, TrainSettings(qa_data="q.json", qa_fraction=0.5)) == "aaee071d91"
    assert _config_key(dataclasses.replace(cfg, width=cfg.width + 1), TrainSettings()) != "3a33fcdcd0"
    assert _config_key(cfg, TrainSettings(full_vocab_kl=True)) != "3a33fcdcd0"


def test_a_checkpoint_of_a_removed_design_is_refused_by_name(pair, tmp_path):
    """A checkpoint that used a design since removed (e.g. a token window of 2) is a one-line error naming the file
    and the sizes, not a TypeError; one that recorded the removed sizes at their defaults (every checkpoint saved
    while they existed) loads as the design it is."""
    translator = _rounded_translator(pair, "mot")
    path = translator.save(tmp_path / "old.safetensors")
    with safe_open(str(path), "pt") as f:
        metadata, tensors = f.metadata(), {key: f.get_tensor(key) for key in f.keys()}
    config = json.loads(metadata["config"])
    unused = {"token_window": 1, "expert_inputs": "trunk", "focus_layers": [], "focus_scale": 1}
    save_file(tensors, str(path), metadata={**metadata, "config": json.dumps({**config, **unused})})
    assert read_translator(path).net.cfg == translator.net.cfg
    for used in ({"token_window": 2}, {"expert_inputs": "depth"}, {"focus_layers": [3], "focus_scale": 3}):
        save_file(tensors, str(path), metadata={**metadata, "config": json.dumps({**config, **unused, **used})})
        with pytest.raises(TranslatorError, match=rf"old\.safetensors was trained with a design since removed "
                                                  rf"\({', '.join(sorted(used))};"):
            read_translator(path)


def test_translated_chunk_uses_the_aligned_source_tokens(pair):
    """Changing one source token's KV changes only the target tokens aligned to it (token-local translation)."""
    source, target = pair
    translator = _rounded_translator(pair, "mot")
    kv, ids, offsets = source_chunk(source, TEXT)
    out, target_ids = translator.translate(kv, ids, offsets, TEXT, target)
    target_offsets = torch.tensor(target.tokenizer(TEXT, add_special_tokens=False,
                                                   return_offsets_mapping=True)["offset_mapping"])
    weights = align(offsets, target_offsets, translator.cfg.align_mode)
    poked = ChunkKV(kv.keys.clone(), kv.values.clone())
    poked.values[:, 5] += 3.0
    changed, _ = translator.translate(poked, ids, offsets, TEXT, target)
    moved = (changed.keys - out.keys).abs().flatten(2).amax(dim=(0, 2)) > 0  # [Tt]
    assert torch.equal(moved, weights[:, 5] > 0)


def test_missing_and_mismatched_translators_are_refused(pair, tmp_path, monkeypatch):
    source, target = pair
    monkeypatch.setenv("CAGKIT_TRANSLATORS", str(tmp_path))
    with pytest.raises(TranslatorError) as missing:
        load_translator("tiny-src", "src-fp", target)
    assert str(tmp_path / "tiny-src__tiny-tgt.safetensors") in str(missing.value)
    assert "cagkit translators train --source tiny-src --target tiny-tgt" in str(missing.value)

    _rounded_translator(pair, "mot").save(translator_path("tiny-src", "tiny-tgt"))
    with pytest.raises(TranslatorError) as wrong_source:
        load_translator("tiny-src", "other-src-fp", target)
    assert "src-fp" in str(wrong_source.value) and "other-src-fp" in str(wrong_source.value)
    other_target = dataclasses.replace(target, fingerprint="other-tgt-fp")
    with pytest.raises(TranslatorError) as wrong_target:
        load_translator("tiny-src", "src-fp", other_target)
    assert "tgt-fp" in str(wrong_target.value) and "other-tgt-fp" in str(wrong_target.value)
    translator = load_translator("tiny-src", "src-fp", target)
    kv, ids, offsets = source_chunk(source, TEXT)
    with pytest.raises(TranslatorError, match="other-tgt-fp"):
        translator.translate(kv, ids, offsets, TEXT, other_target)
