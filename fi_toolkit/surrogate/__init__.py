"""The FI-trained surrogate's home: its training corpus (:mod:`~fi_toolkit.surrogate.corpus`, open text that
ships inside registry packages, named with checksums in ``corpus.json``) and the label factory
(:mod:`~fi_toolkit.surrogate.labels`, ``fi labels``: per-(layer, KV head, position) Forward Influence at
several compression points of every document, resumable and sharded).
"""
