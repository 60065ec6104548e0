"""The field map (``fi field``): every project policy and kvpress press placed against the FI oracle, at several
budgets, on the same documents (its figures: :mod:`fi_toolkit.report`).

- :mod:`.spec`: the methods and budgets, parsed and checked without torch; the two anchors (random, FI oracle);
- :mod:`.settings`: ``FieldSettings``, what the map places and where (light: the command line builds it);
- :mod:`.run`: ``run_field``, the resumable, sharded run, one unit per (document, method) cell;
- :mod:`.tasks`: task accuracy, each method answering as ``fi eval --task`` answers;
- :mod:`.summary`: the summaries (headroom, leaderboard, paired tests) from the per-cell tables.
"""
