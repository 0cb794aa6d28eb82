"""The `select` control: the target prefills only the sentences the question-selected repair would recompute, in
document order, and reads no stored KV (`cagkit.kv.context.SelectedSentences`, `cagkit.kv.selection`)."""

from __future__ import annotations

import pytest

from cagkit.ask import answer_from_chunks, ask, build_context_cache
from cagkit.cli import main
from cagkit.config import Placement
from cagkit.errors import CagkitError
from cagkit.generation import prompt_parts
from cagkit.kv.context import CHUNK_SEPARATOR, SelectedSentences, context_source
from cagkit.kv.selection import budget, selected_sentences
from cagkit.retrieval.search import retrieve
from cagkit.store.store import Hit, Store

BAKERY = ("The bakery on Mill Street opened in 1901. Its oven was brought from Vienna in 1923 by the founder's "
          "grandson. The shop sells rye bread on Saturdays.")
HARBOUR = ("The harbour holds forty fishing boats. A lighthouse at its mouth flashes green every nine seconds. "
           "Gulls nest on the breakwater in spring.")
QUESTION = "Where was the bakery's oven brought from?"


def _hits(*texts: str) -> list[Hit]:
    return [Hit(chunk_id=i, doc_path=f"doc{i}.txt", idx=0, text=t, score=1.0) for i, t in enumerate(texts)]


def test_selected_sentences_are_the_closest_whole_sentences_within_the_budget(smollm2_tokenizer):
    texts = [BAKERY, HARBOUR]
    total = sum(len(smollm2_tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    # a budget below one sentence keeps that sentence whole, and only it
    kept = selected_sentences(smollm2_tokenizer, texts, QUESTION, 0.1)
    assert [[BAKERY[a:b] for a, b in spans] for spans in kept] == [
        ["Its oven was brought from Vienna in 1923 by the founder's grandson."], []]
    (start, end), = kept[0]
    assert budget(0.1, total) <= len(smollm2_tokenizer(BAKERY[start:end], add_special_tokens=False)["input_ids"])
    # a larger share adds sentences, the lighthouse one for a lighthouse question, each whole and in order
    kept = selected_sentences(smollm2_tokenizer, texts, "How often does the lighthouse flash?", 0.4)
    harbour = [HARBOUR[a:b] for a, b in kept[1]]
    assert "A lighthouse at its mouth flashes green every nine seconds." in harbour
    assert all(sentence.endswith(".") for spans, text in zip(kept, texts) for sentence in
               (text[a:b] for a, b in spans))
    assert all(spans == sorted(spans) for spans in kept)
    # the whole share keeps every sentence
    assert sum(len(spans) for spans in selected_sentences(smollm2_tokenizer, texts, QUESTION, 1.0)) == 6


def test_select_prompt_is_prefix_then_selected_sentences_then_question(tiny_llama):
    placement = Placement(blend=0.1)
    hits = _hits(BAKERY, HARBOUR)
    source = context_source("select", tiny_llama, store=None, placement=placement)
    assert isinstance(source, SelectedSentences)
    cache = build_context_cache(tiny_llama, store=None, hits=hits, question=QUESTION, mode="select",
                                placement=placement)
    prefix, suffix = prompt_parts(tiny_llama, QUESTION)
    context = tiny_llama.tokenizer("Its oven was brought from Vienna in 1923 by the founder's grandson.",
                                   add_special_tokens=False)["input_ids"]
    assert cache.pending_ids == prefix + context + suffix  # nothing placed: the target prefills it all
    assert cache.cache.get_seq_length() == 0
    assert (cache.mode, cache.context_tokens, cache.translate_s) == ("select", len(context), 0.0)
    assert cache.placement == {"blend": 0.1, "blend_select": "question"}
    # chunks of two documents read in document order, a blank line between them
    question = "Which oven, which lighthouse?"
    both = build_context_cache(tiny_llama, None, hits[::-1], question, "select", Placement(blend=0.6)).pending_ids
    prefix, suffix = prompt_parts(tiny_llama, question)
    first, second = tiny_llama.tokenizer.decode(both[len(prefix):-len(suffix)]).split(CHUNK_SEPARATOR)
    assert "oven" in first and "lighthouse" in second


def test_an_empty_context_selects_nothing_and_select_answers_from_the_question_alone(tiny_llama):
    import torch

    from cagkit.kv.selection import top_tokens

    assert budget(0.15, 0) == 0 and budget(0.15, 1) == 1
    assert top_tokens(torch.zeros(0, dtype=torch.float64), 0.15).tolist() == []
    assert selected_sentences(tiny_llama.tokenizer, [], QUESTION, 0.15) == []
    cache = build_context_cache(tiny_llama, store=None, hits=[], question=QUESTION, mode="select",
                                placement=Placement())
    prefix, suffix = prompt_parts(tiny_llama, QUESTION)
    assert cache.pending_ids == prefix + suffix and cache.context_tokens == 0


def test_select_reads_no_stored_kv(tiny_llama, tmp_path):
    """The control works on a store whose KV files are all gone: only the manifest's chunk text is read."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bakery.txt").write_text(BAKERY)
    (docs / "harbour.txt").write_text(HARBOUR)
    store = tmp_path / "store"
    assert main(["ingest", str(docs), "--store", str(store), "--source", "tiny-llama", "--quiet"]) == 0
    for file in (store / "kv").glob("*.safetensors"):
        file.unlink()
    answer = ask(QUESTION, store=store, model="tiny-llama", mode="select", max_new_tokens=3, top_k=2)
    assert answer.mode == "select" and answer.context_tokens > 0
    assert answer.placement == {"blend": Placement().blend, "blend_select": "question"}
    with Store.open(store) as st:  # the same answer from the same chunks, given directly
        hits = retrieve(st, QUESTION, 2)
        again = answer_from_chunks(tiny_llama, st, hits, QUESTION, "select", 3)
    assert again.answer == answer.answer
    with pytest.raises(Exception):  # a mode that reads KV cannot run on that store
        ask(QUESTION, store=store, model="tiny-llama", mode="mot", max_new_tokens=3, top_k=2)


@pytest.mark.parametrize("options, fix", [(["--blend", "0"], "pass a share above 0"),
                                          (["--blend-select", "deviation"], "leave --blend-select at question")])
def test_select_refuses_placements_it_cannot_choose_by(tiny_llama, tmp_path, capsys, options, fix):
    with pytest.raises(CagkitError, match=fix):
        SelectedSentences.check(Placement(blend=0.0) if options[0] == "--blend" else
                                Placement(blend_select="deviation"))
    # the command refuses before opening a store or loading a model
    assert main(["ask", QUESTION, "--store", str(tmp_path / "none"), "--model", "tiny-llama", "--mode", "select",
                 *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fix in err[0]
