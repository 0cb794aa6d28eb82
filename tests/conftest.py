"""Shared fixtures: tiny random models built from configs, registered under a name, with real tokenizers."""

from __future__ import annotations

import os

import pytest
import torch

from cagkit.models.loading import LoadedModel, register_loaded
from cagkit.models.registry import convert

# The suite's models run on the CPU, also where there is a GPU (which `auto` would pick): tests compare against
# CPU tensors. tests/models/test_device.py puts copies on CUDA itself.
os.environ.setdefault("CAGKIT_DEVICE", "cpu")
# One CPU thread per test process unless OMP_NUM_THREADS says otherwise: the tiny models gain nothing from more,
# and beside a busy process PyTorch's threads wait on each other (the whole suite took 141 s with its default
# threads and 95 s with one, next to one busy process on this 2-core machine; 90 and 92 s idle). Subprocesses
# that tests start inherit it through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def real_tokenizers() -> dict:
    """The real tokenizers of the three shipped models (converting each model once if this machine has not yet)."""
    from transformers import AutoTokenizer

    return {alias: AutoTokenizer.from_pretrained(convert(alias)) for alias in ("smollm2", "gemma", "qwen")}


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer; only this model is converted, so tests that need no other stay quick."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(convert("smollm2"))


@pytest.fixture(scope="session")
def gemma_tokenizer(real_tokenizers):
    return real_tokenizers["gemma"]


def make_tiny_llama(tokenizer, seed: int = 0, layers: int = 2, kv_heads: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=kv_heads, vocab_size=len(tokenizer), max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


def make_tiny_gemma3(tokenizer, seed: int = 0):
    """A 6-layer Gemma 3 with a 16-token sliding window on 5 of 6 layers and two RoPE bases, like the real one."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(num_hidden_layers=6, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=32, vocab_size=len(tokenizer), sliding_window=16,
                              max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_llama(smollm2_tokenizer) -> LoadedModel:
    """A 2-layer random Llama with the SmolLM2 tokenizer and chat template, loadable as model 'tiny-llama'."""
    lm = LoadedModel(name="tiny-llama", model=make_tiny_llama(smollm2_tokenizer), tokenizer=smollm2_tokenizer,
                     fingerprint="tiny-llama-fp", chat=True)
    register_loaded("tiny-llama", lm)
    return lm


@pytest.fixture(scope="session")
def tiny_gemma(smollm2_tokenizer) -> LoadedModel:
    """A 6-layer random Gemma 3 (sliding windows, two RoPE bases), plain prompts, loadable as 'tiny-gemma'."""
    lm = LoadedModel(name="tiny-gemma", model=make_tiny_gemma3(smollm2_tokenizer), tokenizer=smollm2_tokenizer,
                     fingerprint="tiny-gemma-fp", chat=False)
    register_loaded("tiny-gemma", lm)
    return lm


@pytest.fixture(scope="session")
def s3(tmp_path_factory, monkeypatch_session):
    """An S3-compatible server process for the session (moto), with this process's environment pointed at it."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    from s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3"))
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch_session.setenv(key, server.env[key])
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "lance"])
def manifest(request) -> str:
    """Each kind of store in turn, as `ingest(..., manifest=)` and `Store.open_for_writing(..., manifest=)` name
    it: a store test that takes this runs over both kinds (LanceDB's needs `lancedb`)."""
    if request.param == "lance":
        pytest.importorskip("lancedb")
    return request.param


@pytest.fixture(scope="session")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


# Two short documents (`docs`), ingested by the tiny Llama in 32-token chunks (`ingest_docs`): the store tests'
# common ground, in tests/ingest and tests/store alike.
LIGHTHOUSE = ("The lighthouse on Kerrow Point was built in 1871 by the engineer Mara Ellison.\n\n"
              "It is 41 metres tall, and its light can be seen from thirty kilometres away on a clear night.")
BAKERY = ("The bakery on Mill Street sells rye bread every Tuesday and Friday morning.\n\n"
          "Its oven was brought from Vienna in 1923 by the founder's grandson, a baker named Josef Weber.")


@pytest.fixture
def docs(tmp_path):
    """A folder of two documents: lighthouse.md and bakery.txt."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "lighthouse.md").write_text(LIGHTHOUSE)
    (folder / "bakery.txt").write_text(BAKERY)
    return folder


def ingest_docs(docs, store, **kw):
    """`ingest` of the folder `docs` into `store` by the tiny Llama (the `tiny_llama` fixture), 32-token chunks."""
    from cagkit.ingest.pipeline import ingest

    return ingest([docs], store=store, source="tiny-llama", chunk_tokens=32, progress=False, **kw)
