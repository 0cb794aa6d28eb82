"""Decoding: what is streamed joins to the final answer; base models stop after the first line, chat models at end of turn."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cagkit.generation import generate, next_token, prompt_parts, stop_ids
from cagkit.models.loading import LoadedModel


class ScriptedModel(torch.nn.Module):
    """A causal LM whose greedy choices follow a script of token ids, to test the decoding loop exactly."""

    def __init__(self, script: list[int], vocab: int, eos: int):
        super().__init__()
        self.script = list(script)
        self.vocab = vocab
        self.generation_config = SimpleNamespace(eos_token_id=eos)
        self.calls = 0

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0):
        token = self.script[self.calls] if self.calls < len(self.script) else self.generation_config.eos_token_id
        self.calls += 1
        logits = torch.zeros(1, logits_to_keep or input_ids.shape[1], self.vocab)
        logits[0, -1, token] = 1.0
        return SimpleNamespace(logits=logits)


def _scripted(tokenizer, text: str, chat: bool) -> LoadedModel:
    script = tokenizer(text, add_special_tokens=False)["input_ids"]
    model = ScriptedModel(script, len(tokenizer), tokenizer.eos_token_id)
    return LoadedModel(name="scripted", model=model, tokenizer=tokenizer, fingerprint="scripted", chat=chat)


@pytest.mark.parametrize("chat, text, expected", [
    (False, " The engineer Mara Ellison.\nQuestion: who else?", "The engineer Mara Ellison."),
    (True, "Mara Ellison built it.\nShe was an engineer. ✓", "Mara Ellison built it.\nShe was an engineer. ✓"),
])
def test_streamed_pieces_join_to_the_answer(smollm2_tokenizer, chat, text, expected):
    lm = _scripted(smollm2_tokenizer, text, chat)
    pieces: list[str] = []
    gen = generate(lm, cache=None, input_ids=[1, 2, 3], max_new_tokens=50, on_text=pieces.append)
    assert gen.text == expected
    assert "".join(pieces).strip() == expected
    assert len(pieces) > 3  # streamed piece by piece, not in one go


def test_end_of_turn_token_stops_a_chat_model(smollm2_tokenizer):
    text = "Yes.<|im_end|>Ignored"
    lm = _scripted(smollm2_tokenizer, text, chat=True)
    assert smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>") in stop_ids(lm)
    assert generate(lm, None, [1], max_new_tokens=50).text == "Yes."


def test_stop_ids_find_what_the_whole_vocabulary_has(real_tokenizers):
    """Looked up one by one (get_vocab() copies the whole vocabulary, 0.4 s for gemma's), the end-of-turn tokens
    are those the vocabulary holds, for each real tokenizer and for one without a fast backend."""
    from cagkit.generation import _END_OF_TURN

    class VocabOnly:  # a tokenizer that only offers get_vocab()
        def __init__(self, tok):
            self.eos_token_id, self.get_vocab = tok.eos_token_id, tok.get_vocab

    for alias, tok in real_tokenizers.items():
        vocab = tok.get_vocab()
        expected = {vocab[t] for t in _END_OF_TURN if t in vocab} | {tok.eos_token_id}
        assert len(expected) >= 2, (alias, expected)  # an end-of-turn token beside EOS
        for tokenizer in (tok, VocabOnly(tok)):
            lm = SimpleNamespace(tokenizer=tokenizer, model=SimpleNamespace(
                generation_config=SimpleNamespace(eos_token_id=None)))
            assert stop_ids(lm) == expected, alias
    assert 106 in stop_ids(SimpleNamespace(tokenizer=real_tokenizers["gemma"], model=SimpleNamespace(
        generation_config=SimpleNamespace(eos_token_id=None))))  # gemma's <end_of_turn>


def test_max_new_tokens_bounds_the_answer(smollm2_tokenizer):
    lm = _scripted(smollm2_tokenizer, " one two three four five six", chat=True)
    gen = generate(lm, None, [1], max_new_tokens=3)
    assert len(gen.token_ids) == 3


def test_prompt_parts_surround_the_context(tiny_llama, tiny_gemma):
    prefix, suffix = prompt_parts(tiny_llama, "Who built it?")
    tok = tiny_llama.tokenizer
    assert tok.decode(prefix).startswith("<|im_start|>") and tok.decode(prefix).endswith("Context:\n")
    assert "Question: Who built it?" in tok.decode(suffix) and tok.decode(suffix).endswith("<|im_start|>assistant\n")
    prefix, suffix = prompt_parts(tiny_gemma, "Who built it?")
    assert tok.decode(suffix).endswith("Question: Who built it?\nAnswer:")



def test_next_token_never_repeats_an_ngram_of_the_answer():
    logits = torch.tensor([0.0, 5.0, 4.0, 3.0, 1.0])  # greedy order: 1, 2, 3, 4, 0
    assert next_token(logits, [], ngram=2) == 1
    assert next_token(logits, [1, 3, 1], ngram=2) == 1  # after 1 only 3 is banned ("1 3" was said)
    assert next_token(logits, [1, 1], ngram=2) == 2  # "1 1" was said: the next best
    assert next_token(logits, [2, 1, 3, 2], ngram=3) == 1  # no trigram of the answer starts "3 2"
    assert next_token(logits, [3, 2, 1, 4, 3, 2], ngram=3) == 2  # "3 2 1" was said
    assert next_token(logits, [1, 1], ngram=0) == 1  # the guard off: plain greedy


def test_a_looping_model_is_pushed_out_of_its_loop(smollm2_tokenizer):
    """A model whose first choice is always to say its phrase again says it about twice, then its second choice:
    greedy decoding alone would repeat the phrase until max_new_tokens."""
    phrase = smollm2_tokenizer("The answer is:", add_special_tokens=False)["input_ids"]
    (vienna,) = smollm2_tokenizer(" Vienna", add_special_tokens=False)["input_ids"]
    eos = smollm2_tokenizer.eos_token_id

    class Looping(torch.nn.Module):
        generation_config = SimpleNamespace(eos_token_id=eos)

        def __init__(self):
            super().__init__()
            self.said: list[int] = []

        def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0):
            if self.calls:
                self.said.append(int(input_ids[0, -1]))  # the token chosen last step
            self.calls += 1
            logits = torch.zeros(1, 1, len(smollm2_tokenizer))
            logits[0, -1, phrase[len(self.said) % len(phrase)]] = 2.0
            logits[0, -1, vienna] = 1.0
            if self.said and self.said[-1] == vienna:
                logits[0, -1, eos] = 3.0
            return SimpleNamespace(logits=logits)

        calls = 0

    lm = LoadedModel(name="looping", model=Looping(), tokenizer=smollm2_tokenizer, fingerprint="l", chat=True)
    expected = smollm2_tokenizer.decode(phrase + phrase[:-1] + [vienna])  # the 4-gram ending in ":" is refused
    assert generate(lm, None, [1, 2], max_new_tokens=40).text == expected.strip()
