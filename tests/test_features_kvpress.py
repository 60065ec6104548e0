"""The in-house KeyDiff feature against kvpress's own ``KeyDiffPress.score`` (the kvpress venv)."""

from __future__ import annotations

import pytest
import torch

from fi_toolkit.policies.features import keydiff

pytestmark = pytest.mark.kvpress


def test_keydiff_scores_as_kvpress_keydiffpress():
    press_module = pytest.importorskip("kvpress.presses.keydiff_press")
    keys = torch.randn(1, 3, 50, 16, generator=torch.Generator().manual_seed(0)) + 0.5
    theirs = press_module.KeyDiffPress(compression_ratio=0.5).score(None, None, keys, None, None, {})[0]
    ours = keydiff(keys)
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-5, atol=1e-6)
    assert torch.equal(ours.argsort(dim=-1, stable=True), theirs.double().argsort(dim=-1, stable=True))
