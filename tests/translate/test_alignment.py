"""Character-span alignment: hand-made spans, then the real smollm2 / gemma / qwen tokenizers."""

from __future__ import annotations

import pytest
import torch

from cagkit.translate.alignment import align

TEXT = "Héllo  world,\n\n  naïve café — 北京 test😀 end. The   spaces\tand\ttabs, 12345 numbers!"


def test_cover_takes_the_source_token_covering_the_last_character():
    source = [(0, 3), (3, 7), (7, 8)]
    target = [(0, 2), (2, 5), (5, 8)]
    weights = align(source, target, "cover")
    assert weights.argmax(dim=1).tolist() == [0, 1, 2]
    assert torch.equal(weights.sum(dim=1), torch.ones(3))


def test_overlap_weighs_by_shared_characters():
    source = [(0, 3), (3, 7), (7, 8)]
    target = [(0, 2), (2, 5), (5, 8)]
    weights = align(source, target, "overlap")
    expected = torch.tensor([[1.0, 0, 0], [1 / 3, 2 / 3, 0], [0, 2 / 3, 1 / 3]])
    assert torch.allclose(weights, expected)


def test_awkward_spans():
    # source: byte-fallback pieces sharing one char (1,2), an empty special token, a gap at char 4 no token covers
    source = [(0, 1), (1, 2), (1, 2), (2, 2), (2, 4), (5, 8)]
    target = [(0, 2), (2, 2), (3, 6), (4, 5)]
    cover = align(source, target, "cover")
    # last char 1 -> the last byte piece; empty target span -> char before it (1); last char 5 -> token 5;
    # the untokenized char 4 -> the nearest source token starting before it (4), never the empty one (3)
    assert cover.argmax(dim=1).tolist() == [2, 2, 5, 4]
    overlap = align(source, target, "overlap")
    assert torch.allclose(overlap[2], torch.tensor([0, 0, 0, 0, 1 / 2, 1 / 2]))
    assert torch.equal(overlap[1], cover[1])  # no shared character: falls back to the covering token
    assert torch.equal(overlap[3], cover[3])
    assert overlap[:, 3].abs().sum() == 0


def test_unknown_mode_and_empty_source_are_refused():
    with pytest.raises(ValueError):
        align([(0, 1)], [(0, 1)], "nearest")
    with pytest.raises(ValueError):
        align(torch.zeros(0, 2), [(0, 1)], "cover")


def _offsets(tokenizer, text):
    return torch.tensor(tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])


@pytest.mark.parametrize("target_alias", ["gemma", "qwen"])
def test_real_tokenizers_cover_is_consistent(real_tokenizers, target_alias):
    source, target = _offsets(real_tokenizers["smollm2"], TEXT), _offsets(real_tokenizers[target_alias], TEXT)
    assert len(target) > 20
    for mode in ("cover", "overlap"):
        weights = align(source, target, mode)
        assert weights.shape == (len(target), len(source))
        assert torch.allclose(weights.sum(dim=1), torch.ones(len(target)))
    cover = align(source, target, "cover").argmax(dim=1)
    for t, s in enumerate(cover.tolist()):
        last = max(int(target[t, 1]) - 1, int(target[t, 0]))
        # the chosen source token contains the target token's last character, or (whitespace gap) ends before it
        assert source[s, 0] <= last
        assert last < source[s, 1] or not any(source[s + 1:, 0] <= last)
    # cover never looks ahead of the target token's text in reading order
    assert torch.all(source[cover, 0] < target[:, 1].clamp(min=1))
    overlap = align(source, target, "overlap")
    for t in range(len(target)):
        used = overlap[t].nonzero().squeeze(1)
        spans = source[used]
        shares = torch.minimum(spans[:, 1], target[t, 1]) - torch.maximum(spans[:, 0], target[t, 0])
        assert torch.all(shares > 0) or len(used) == 1


def test_real_tokenizer_aligned_with_itself_is_the_identity(real_tokenizers):
    for alias in ("smollm2", "gemma", "qwen"):
        offsets = _offsets(real_tokenizers[alias], "The quick brown fox jumps over the lazy dog.")
        for mode in ("cover", "overlap"):
            assert torch.equal(align(offsets, offsets, mode), torch.eye(len(offsets))), (alias, mode)


@pytest.mark.parametrize("mode", ["cover", "overlap"])
def test_source_features_gather_is_the_weighted_sum(mode):
    """The gather over the alignment's nonzero weights gives the dense weighted sum of every source token."""
    from cagkit.kv.chunk import ChunkKV
    from cagkit.translate.translator import source_features

    source = torch.tensor([(0, 3), (3, 7), (7, 8), (8, 12), (12, 12), (12, 15)])
    target = torch.tensor([(0, 2), (2, 5), (5, 8), (8, 8), (8, 15)])
    weights = align(source, target, mode)
    assert (mode == "overlap") == bool(((weights > 0) & (weights < 1)).any())  # overlap has shared tokens here
    torch.manual_seed(0)
    kv = ChunkKV(torch.randn(4, len(source), 2, 8).half(), torch.randn(4, len(source), 2, 8).half())
    dense = torch.einsum("ts,lsf->tlf", weights,
                         torch.cat([kv.keys.float().flatten(2), kv.values.float().flatten(2)], dim=-1))
    gathered = source_features(kv, weights)
    assert gathered.shape == (len(target), 4, 32)
    assert torch.allclose(gathered, dense, atol=1e-6)
    empty = source_features(kv, torch.zeros(0, len(source)))
    assert empty.shape == (0, 4, 32)
