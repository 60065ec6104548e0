"""Model loading: the embedded GGUF is converted once, cached, and the copy is the same model."""

from __future__ import annotations

import time

import pytest
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.models import embedded_gguf, load_model, resolve_device, resolve_dtype


@pytest.mark.smollm
def test_first_load_converts_and_caches_a_copy_that_loads_fast(tmp_path, monkeypatch, smollm):
    monkeypatch.setenv("FI_TOOLKIT_CACHE", str(tmp_path))
    first = load_model()
    copies = list((tmp_path / "models").glob(f"{embedded_gguf().stem}-*"))
    assert len(copies) == 1 and (copies[0] / "model.safetensors").exists()
    assert not list((tmp_path / "models").glob(".staging-*"))  # the atomic rename left no debris
    t0 = time.perf_counter()
    second = load_model()
    assert time.perf_counter() - t0 < 5.0
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]])
    with torch.no_grad():
        a, b, c = (m.model(ids).logits for m in (first, second, smollm))
    assert torch.equal(a, b) and torch.equal(a, c)


def test_device_and_dtype_errors():
    with pytest.raises(FIError, match="unknown dtype"):
        resolve_dtype("int4")
    with pytest.raises(FIError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(FIError, match="CUDA is not available"):
            resolve_device("cuda")
