"""The policies learned from Forward Influence by ``fi fit`` (their training: :mod:`fi_toolkit.fit`).

- :mod:`.fitted`: ``Fitted`` (``fitted:path=FILE``), a linear score of compression-time signals (the ridge
  learner's policy), and its features (``FEATURES``, ``feature_matrix``);
- :mod:`.lambdarank`: ``Learned`` (``learned[:path=FILE]``), a LightGBM LambdaRank model read from JSON and
  evaluated in numpy (the lambdarank learner's policy);
- :mod:`.features`: the learned policy's features beyond the fitted policy's (depth, KV head, KeyDiff, value
  norms, ExpectedAttention's and TOVA's scores, which the ``expected_attention`` and ``tova`` policies score by).
"""

from __future__ import annotations

from fi_toolkit.policies.learned.fitted import Fitted
from fi_toolkit.policies.learned.lambdarank import Learned

__all__ = ["Fitted", "Learned"]
