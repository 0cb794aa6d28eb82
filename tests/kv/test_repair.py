"""Cross-chunk repair (`cagkit.kv.repair`) on tiny random models, checked against a joint prefill of the same text."""

import pytest
import torch

from cagkit.ingest.chunking import sentence_spans
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.prefill import prefill_kv
from cagkit.kv.repair import JOINT_LAYERS, blend
from cagkit.kv.selection import question_priority
from conftest import make_tiny_gemma3, make_tiny_llama


def _chunks_and_joint(model, tokenizer):
    """Three chunks prefilled alone after a sink (as a store holds them) and the joint prefill of all of them."""
    texts = ["The lighthouse keeper counted ships every night.", " In spring the harbour froze over twice,",
             " and the keeper's daughter walked across the ice to the island to bring him bread and lamp oil."]
    sink = [tokenizer.bos_token_id]
    prefix = sink + tokenizer("Context:\n", add_special_tokens=False)["input_ids"]
    chunk_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    alone = []
    for ids in chunk_ids:
        kv = prefill_kv(model, sink + ids)
        alone.append(ChunkKV(kv.keys[:, 1:], kv.values[:, 1:]))
    joint = prefill_kv(model, prefix + [t for c in chunk_ids for t in c])
    start = len(prefix)
    return prefix, chunk_ids, alone, ChunkKV(joint.keys[:, start:], joint.values[:, start:])


def _error(chunks, joint) -> float:
    keys = torch.cat([c.keys for c in chunks], 1)
    values = torch.cat([c.values for c in chunks], 1)
    return float(((keys - joint.keys) ** 2).mean() + ((values - joint.values) ** 2).mean())


@pytest.mark.parametrize("make", [lambda tok: make_tiny_llama(tok, layers=4), make_tiny_gemma3],
                         ids=["llama", "gemma3-sliding"])
def test_full_ratio_equals_a_joint_prefill(make, smollm2_tokenizer):
    model = make(smollm2_tokenizer)
    prefix, chunk_ids, alone, joint = _chunks_and_joint(model, smollm2_tokenizer)
    assert sum(len(c) for c in chunk_ids) > 16  # longer than the tiny Gemma's sliding window
    assert _error(alone, joint) > 1e-4  # chunks prefilled alone do differ from the joint prefill
    repaired = blend(model, prefix, alone, chunk_ids, 1.0)
    assert [c.num_tokens for c in repaired] == [len(c) for c in chunk_ids]
    torch.testing.assert_close(torch.cat([c.keys for c in repaired], 1), joint.keys, atol=2e-4, rtol=1e-3)
    torch.testing.assert_close(torch.cat([c.values for c in repaired], 1), joint.values, atol=2e-4, rtol=1e-3)


def test_partial_ratio_moves_towards_the_joint_prefill(smollm2_tokenizer):
    model = make_tiny_gemma3(smollm2_tokenizer)
    prefix, chunk_ids, alone, joint = _chunks_and_joint(model, smollm2_tokenizer)
    before = _error(alone, joint)
    quarter = blend(model, prefix, alone, chunk_ids, 0.25)
    half = blend(model, prefix, alone, chunk_ids, 0.5)
    assert _error(half, joint) < _error(quarter, joint) < before
    # the bottom layers come from the joint prefill for every token
    torch.testing.assert_close(torch.cat([c.keys for c in quarter], 1)[:JOINT_LAYERS], joint.keys[:JOINT_LAYERS])
    # the input is not modified
    assert _error(alone, joint) == before


def test_zero_ratio_and_bad_input(smollm2_tokenizer):
    model = make_tiny_llama(smollm2_tokenizer, layers=3)
    prefix, chunk_ids, alone, _ = _chunks_and_joint(model, smollm2_tokenizer)
    assert blend(model, prefix, alone, chunk_ids, 0.0) is alone
    with pytest.raises(ValueError, match="between 0 and 1"):
        blend(model, prefix, alone, chunk_ids, 1.5)
    with pytest.raises(ValueError, match="token ids"):
        blend(model, prefix, alone, [ids[:-1] for ids in chunk_ids], 0.5)


def test_sentence_spans_end_after_punctuation_and_line_breaks():
    text = 'The keeper counted ships. "Twice," she said! Was it cold?\nYes\n\n  and more'
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == [
        "The keeper counted ships.", '"Twice," she said!', "Was it cold?", "Yes", "and more"]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # in order, whitespace between them left out
    assert sentence_spans("") == []


def _bag_of_words(texts):
    """A stand-in embedder: unit vectors of word counts over a small vocabulary."""
    vocab = ["ships", "harbour", "froze", "ice", "bread", "keeper", "spring"]
    rows = torch.tensor([[t.lower().count(w) for w in vocab] for t in texts], dtype=torch.float32) + 1e-3
    return torch.nn.functional.normalize(rows, dim=-1).numpy()


def test_question_priority_ranks_the_relevant_sentence_first_and_blend_recomputes_it(smollm2_tokenizer):
    texts = ["The keeper counted ships. He slept by day.", " In spring the harbour froze over. The ice was thick."]
    offsets = [torch.tensor(smollm2_tokenizer(t, add_special_tokens=False, return_offsets_mapping=True)
                            ["offset_mapping"]) for t in texts]
    sentences = []
    for text in texts:
        spans = sentence_spans(text)
        sentences.append((spans, _bag_of_words([text[a:b] for a, b in spans])))
    priority = question_priority(_bag_of_words(["When did the harbour freeze?"])[0], sentences, offsets)
    assert priority.shape == (sum(len(o) for o in offsets),)
    second = offsets[1]
    in_harbour = second[:, 1] <= texts[1].index(" The ice")  # " The" opens the next sentence
    best = priority[len(offsets[0]):][in_harbour]
    assert best.min() > priority[~torch.cat([torch.zeros(len(offsets[0]), dtype=torch.bool), in_harbour])].max()
    assert bool((best[1:] < best[:-1]).all())  # earlier tokens first within the sentence

    model = make_tiny_llama(smollm2_tokenizer, layers=4)
    prefix, chunk_ids, alone, joint = _chunks_and_joint(model, smollm2_tokenizer)
    # recompute exactly the tokens given the highest priority: only they change above the joint layers
    order = torch.zeros(sum(len(c) for c in chunk_ids))
    order[3:7] = 1.0
    count = 4
    repaired = blend(model, prefix, alone, chunk_ids, count / len(order), priority=order)
    before, after = torch.cat([c.keys for c in alone], 1), torch.cat([c.keys for c in repaired], 1)
    changed = (before[JOINT_LAYERS:] - after[JOINT_LAYERS:]).abs().amax(dim=(0, 2, 3)) > 1e-6
    assert changed.nonzero().flatten().tolist() == [3, 4, 5, 6]
    with pytest.raises(ValueError, match="priority"):
        blend(model, prefix, alone, chunk_ids, 0.5, priority=order[:-1])


def test_the_repair_prefills_the_prompt_prefix_once_per_model(smollm2_tokenizer):
    """The prefix's KV is the one `prefix_cache` keeps per model, so a second repair runs no pass over it, and
    answers the same."""
    from cagkit.models.architecture import decoder_stack

    model = make_tiny_llama(smollm2_tokenizer, layers=4)
    prefix, chunk_ids, alone, _ = _chunks_and_joint(model, smollm2_tokenizer)
    passes = []  # the tokens of every pass through the decoder stack
    hook = decoder_stack(model).register_forward_pre_hook(
        lambda module, args, kwargs: passes.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        first = blend(model, prefix, alone, chunk_ids, 0.5)
        second = blend(model, prefix, alone, chunk_ids, 0.5)
    finally:
        hook.remove()
    context = sum(len(c) for c in chunk_ids)
    # the first: prefix (memoised), bottom layers jointly, the chosen half; the second: the last two only
    assert passes == [len(prefix) + context, len(prefix), context // 2, len(prefix) + context, context // 2]
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_loaded_models_prompt_prefix_kv_is_kept_on_disk_for_the_next_process(smollm2_tokenizer, tmp_path,
                                                                                  monkeypatch):
    """A model with a fingerprint (as `load_model` gives it) writes its prefix's KV under $CAGKIT_HOME once; a new
    process (the memo emptied) reads it without a pass through the decoder, to the same tensors. A file that is
    damaged or holds other token ids is prefilled again and rewritten; a model of other weights has its own."""
    from cagkit.kv.prefill import saved_prefix_path, shared_prefix
    from cagkit.models.architecture import decoder_stack

    monkeypatch.setenv("CAGKIT_HOME", str(tmp_path))
    model = make_tiny_llama(smollm2_tokenizer, layers=4)
    prefix = smollm2_tokenizer("A prompt prefix before every context.")["input_ids"]
    assert saved_prefix_path(model, prefix) is None  # no fingerprint: kept in this process only
    model.__dict__["_cagkit_fingerprint"] = "weights-a"
    path = saved_prefix_path(model, prefix)
    assert path.parent == tmp_path / "prefix-kv" and not path.exists()
    passes = []
    hook = decoder_stack(model).register_forward_pre_hook(lambda *a, **k: passes.append(1), with_kwargs=True)
    try:
        computed = shared_prefix(model, prefix)
        assert path.is_file() and len(passes) == 1
        model.__dict__.pop("_cagkit_prefix_kv")  # a new process
        read = shared_prefix(model, prefix)
        assert len(passes) == 1 and read is not computed
        for a, b in zip(computed.layers, read.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        path.write_bytes(path.read_bytes()[:100])  # damaged: prefilled again, and written whole again
        model.__dict__.pop("_cagkit_prefix_kv")
        again = shared_prefix(model, prefix)
        assert len(passes) == 2 and torch.equal(again.layers[0].keys, computed.layers[0].keys)
        assert torch.equal(shared_prefix(model, prefix).layers[-1].values, computed.layers[-1].values)
        model.__dict__.pop("_cagkit_prefix_kv")
        shared_prefix(model, prefix)
        assert len(passes) == 2
        other = saved_prefix_path(model, prefix[:-1])
        other.write_bytes(path.read_bytes())  # the file of other token ids under this key: not used
        shared_prefix(model, prefix[:-1])
        assert len(passes) == 3
        model.__dict__["_cagkit_fingerprint"] = "weights-b"
        assert saved_prefix_path(model, prefix) != path
    finally:
        hook.remove()
