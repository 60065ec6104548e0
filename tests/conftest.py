"""Shared fixtures: a tiny random Llama for mechanics, the real SmolLM2 for integration (loaded once)."""

from __future__ import annotations

import pytest
import torch

from fi_toolkit.model.loading import load_model, tiny_model


@pytest.fixture(scope="session")
def tiny():
    """Random-init Llama, 4 layers, 4 query heads over 2 KV heads, vocab 256, float32, sdpa."""
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def tiny_ids():
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (400,), generator=gen)


@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct, float32 on the CPU (converted copy cached after first load)."""
    return load_model("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def alice(smollm):
    """The bundled 'alice' document, first 2,048 tokens."""
    from fi_toolkit.documents import load_document

    return load_document("alice", smollm.tokenizer, max_tokens=2048)
