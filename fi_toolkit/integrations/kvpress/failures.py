"""Why a kvpress press could not run here, in words (one line): a download it needs (nothing is fetched at run
time), data made for other models, a package it needs, or kvpress's own message."""

from __future__ import annotations

MODEL_DATA_WORDS = ("not released", "no statistics", "budget curve")
HUB_WORDS = ("huggingface", "hf.co", " hub", "offline", "connect", "internet", "local folder")


def failure_reason(exc: BaseException) -> str:
    """Why a press failed, in words: a download it needs (nothing is fetched at run time), a package it
    needs, or kvpress's own message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.split(". ")[0].rstrip(".") + "."  # its first sentence
    kind = type(exc).__name__
    where = type(exc).__module__ or ""
    lowered = text.lower()
    hub = any(word in lowered for word in HUB_WORDS)
    if where.startswith(("huggingface_hub", "requests", "urllib3", "datasets")) or (isinstance(exc, OSError) and hub):
        return (
            f"needs a download (weights or data from the Hugging Face Hub), which runs here never make: {kind}: {text}"
        )
    if isinstance(exc, ImportError):
        return f"needs a package that is not installed: {text}"
    if "model" in lowered and any(word in lowered for word in MODEL_DATA_WORDS):
        return f"needs data made for this model (weights, statistics or curves), which kvpress has not: {kind}: {text}"
    return f"kvpress failed on the prefix ({kind}: {text})"
