"""The toolkit as an lm-evaluation-harness backend (docs/guides/lm-eval.md).

- :mod:`.arguments`: the model arguments, checked before a model loads.
- :mod:`.requests`: one request on a compressed cache (scoring, generation), without lm-eval.
- :mod:`.backend`: ``CompressedLM``, registered as ``--model fi`` (imports lm-eval: ``fi_toolkit[lmeval]``).
- :mod:`.export`: the toolkit's long-context tasks as lm-eval task YAMLs (``fi tasks export``).
"""

import importlib

# every name is imported on first use (PEP 562): checking the model arguments loads no torch, and lm-eval
# (an optional dependency, behind the backend's names) is imported only when the backend is asked for
_EXPORTS = {
    "BackendArgs": "arguments",
    "parse_backend_args": "arguments",
    "export_tasks": "export",
    "CacheRecord": "requests",
    "generate_tokens": "requests",
    "score_continuation": "requests",
    "CompressedLM": "backend",
    "annotate_samples": "backend",
    "samples_annotated": "backend",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


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
