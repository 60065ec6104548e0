"""The toolkit as an lm-evaluation-harness backend (docs/guides/lm-eval.md).

- :mod:`.arguments`: the model arguments, checked before a model loads.
- :mod:`.requests`: one request on a compressed cache (scoring, generation), without lm-eval.
- :mod:`.backend`: ``CompressedLM``, registered as ``--model fi`` (imports lm-eval: ``fi_toolkit[lmeval]``).
- :mod:`.export`: the toolkit's long-context tasks as lm-eval task YAMLs (``fi tasks export``).
"""

from fi_toolkit.lazy import lazy_exports

# every name is imported on first use (PEP 562): checking the model arguments loads no torch, and lm-eval
# (an optional dependency, behind the backend's names) is imported only when the backend is asked for
_EXPORTS = {
    "BackendArgs": "fi_toolkit.evaluation.lmeval.arguments",
    "parse_backend_args": "fi_toolkit.evaluation.lmeval.arguments",
    "export_tasks": "fi_toolkit.evaluation.lmeval.export",
    "CacheRecord": "fi_toolkit.evaluation.lmeval.requests",
    "generate_tokens": "fi_toolkit.evaluation.lmeval.requests",
    "score_continuation": "fi_toolkit.evaluation.lmeval.requests",
    "CompressedLM": "fi_toolkit.evaluation.lmeval.backend",
    "annotate_samples": "fi_toolkit.evaluation.lmeval.backend",
    "samples_annotated": "fi_toolkit.evaluation.lmeval.backend",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "BackendArgs",
    "CacheRecord",
    "CompressedLM",
    "annotate_samples",
    "export_tasks",
    "generate_tokens",
    "parse_backend_args",
    "samples_annotated",
    "score_continuation",
]
