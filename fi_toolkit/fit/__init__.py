"""The training of the policies learned from Forward Influence (``fi fit-data``, ``fi fit``; the policies
themselves, ``fitted`` and ``learned``: :mod:`fi_toolkit.policies.learned`).

- :mod:`.settings`: ``FitDataSettings``, ``FitSettings`` and the fit's options, checked without torch;
- :mod:`.rows`: ``fit_rows``, the training rows (features and per-(layer, KV head) Fisher FI) of one document;
- :mod:`.ridge`: ``fit_policy``, the leave-one-document-out ridge fit of the ``fitted`` policy;
- :mod:`.lambdarank`: ``learn_policy``, LightGBM LambdaRank, the ``learned`` policy's training;
- :mod:`.run`: ``run_fit_data`` and ``run_fit``, the ``fi fit-data`` and ``fi fit`` runs.
"""
