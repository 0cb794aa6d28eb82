"""Prompts around placed context, and greedy decoding with streaming.

The context sits in the middle of the prompt: a short target-native prefix (chat header or BOS, which also
serves as the attention sink), then the chunks' KV, then the question. `prompt_parts` cuts a rendered prompt at
the context's place so the prefix and the question can be tokenised and prefilled on their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cagkit.config import NO_REPEAT_NGRAM
from cagkit.errors import CagkitError
from cagkit.models.architecture import context_length
from cagkit.models.device import model_device, synchronize

_CONTEXT_MARK = "\x00CAGKIT-CONTEXT\x00"
# End-of-turn tokens of common chat formats; a token counts only if the model's vocabulary has it.
_END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "<|end|>")


def prompt_parts(lm, question: str) -> tuple[list[int], list[int]]:
    """Token ids before and after the context for `question`: (prefix_ids, suffix_ids).

    Instruct models get their chat template; base models a plain 'Context / Question / Answer' prompt.
    """
    tok = lm.tokenizer
    if lm.chat:
        user = f"Context:\n{_CONTEXT_MARK}\n\nAnswer the question using the context above. Be brief.\nQuestion: {question}"
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
        )
        before, after = rendered.split(_CONTEXT_MARK)
        return tok(before, add_special_tokens=False)["input_ids"], tok(after, add_special_tokens=False)["input_ids"]
    prefix = tok("Context:\n", add_special_tokens=True)["input_ids"]
    suffix = tok(f"\n\nQuestion: {question}\nAnswer:", add_special_tokens=False)["input_ids"]
    return prefix, suffix


def context_prefix(lm) -> list[int]:
    """The prompt's token ids before the context, the same for every question: what a document is prefilled after
    at ingest (`cagkit.kv.prefill.DocumentPrefill`), so that the model that wrote a store reads a document placed
    after this prefix exactly as it would have read it in the prompt."""
    return prompt_parts(lm, "")[0]


def context_room(lm, prefix_ids: list[int], suffix_ids: list[int], max_new_tokens: int) -> int:
    """How many context tokens fit in `lm`'s context (its config's `max_position_embeddings`) beside the prompt's
    `prefix_ids` and `suffix_ids` (the question) and an answer of `max_new_tokens`; a CagkitError naming the
    lengths and the fix when the question and the answer alone do not fit."""
    limit = context_length(lm.config) or 1 << 20  # a config that does not say: no limit of its own
    fixed = len(prefix_ids) + len(suffix_ids) + max_new_tokens
    if fixed > limit:
        raise CagkitError(f"the question is {len(prefix_ids) + len(suffix_ids)} tokens with {lm.name}'s prompt and "
                          f"the answer may take {max_new_tokens} more, over the model's context of {limit} tokens; "
                          f"shorten the question or lower the answer's length (--max-new-tokens, max_tokens)")
    return limit - fixed


def stop_ids(lm) -> set[int]:
    """Token ids that end an answer: the model's EOS ids and any end-of-turn token its vocabulary has."""
    ids: set[int] = set()
    for source in (lm.model.generation_config.eos_token_id, lm.tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    backend = getattr(lm.tokenizer, "backend_tokenizer", None)
    if backend is not None:  # one lookup each: get_vocab() builds a dict of the whole vocabulary (0.4 s for gemma's)
        found = (backend.token_to_id(t) for t in _END_OF_TURN)
    else:
        vocab = lm.tokenizer.get_vocab()
        found = (vocab.get(t) for t in _END_OF_TURN)
    ids.update(i for i in found if i is not None)
    return ids


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prefill_s: float  # prefilling the question (or, in native mode, the whole prompt)
    first_token_at: float  # perf_counter time the first token was ready
    decode_s: float


@torch.no_grad()
def generate(
    lm,
    cache,
    input_ids: list[int],
    max_new_tokens: int,
    on_text: Callable[[str], None] | None = None,
) -> Generation:
    """Prefill `input_ids` after `cache`, then decode greedily, calling `on_text` with each new piece of text.

    Base models (plain prompts) stop at the end of the answer's first line; chat models at end of turn. No
    `NO_REPEAT_NGRAM` tokens are repeated within the answer (`next_token`).
    """
    stops = stop_ids(lm)
    device = model_device(lm.model)
    start = time.perf_counter()
    # Only the last position's logits are needed: the LM head over every prompt token would cost more than the
    # prefill itself for a large vocabulary (Gemma 3 has 262k tokens).
    logits = lm.model(input_ids=torch.tensor([input_ids], device=device), cache=cache, use_cache=True,
                      logits_to_keep=1).logits[0, -1]
    synchronize(device)
    prefill_s = time.perf_counter() - start
    first_token_at = time.perf_counter()
    out: list[int] = []
    text = shown = ""
    decode_start = time.perf_counter()
    for _ in range(max_new_tokens):
        token = next_token(logits, out)
        if token in stops:
            break
        out.append(token)
        text = lm.tokenizer.decode(out, skip_special_tokens=True)
        answer = text.lstrip()
        if not lm.chat and "\n" in answer:
            # Cut after the first line, keeping the leading whitespace so the text still extends what was shown.
            text = text[: len(text) - len(answer)] + answer.split("\n")[0]
            shown = _emit(on_text, shown, text)
            break
        shown = _emit(on_text, shown, text)
        logits = lm.model(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True).logits[0, -1]
    return Generation(text.strip(), out, prefill_s, first_token_at, time.perf_counter() - decode_start)


def next_token(logits: torch.Tensor, out: list[int], ngram: int = NO_REPEAT_NGRAM) -> int:
    """The greedy choice from `logits` [V] after the answer so far `out`, except a token that would repeat an
    `ngram`-token sequence the answer already holds: then the most likely token that does not. Small models
    otherwise fall into loops ("The answer is: The answer is: ...") that greedy decoding never leaves; a short
    answer rarely needs to repeat four tokens in a row. `ngram` 0 turns the guard off."""
    if ngram < 1 or len(out) < ngram - 1:
        return int(torch.argmax(logits))
    tail = tuple(out[len(out) - ngram + 1:])  # the n-1 tokens a new n-gram would start with
    banned = {out[i + ngram - 1] for i in range(len(out) - ngram + 1) if tuple(out[i:i + ngram - 1]) == tail}
    if not banned:
        return int(torch.argmax(logits))
    for token in torch.topk(logits, len(banned) + 1).indices.tolist():  # one of these is not banned
        if token not in banned:
            return token
    raise AssertionError("unreachable: more candidates than banned tokens")


def _emit(on_text, shown: str, text: str) -> str:
    """Stream the part of `text` not yet shown; returns what has been shown so far."""
    # A partial UTF-8 character decodes to U+FFFD; wait for the rest before showing it.
    if on_text is None or text.endswith("\ufffd") or not text.startswith(shown):
        return shown
    if len(text) > len(shown):
        on_text(text[len(shown):])
    return text
