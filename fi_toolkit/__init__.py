"""fi_toolkit: Forward Influence analysis for KV-cache compression research.

Quick start::

    from fi_toolkit import load_model, load_document, probe_document, parse_chunk
    lm = load_model()                                   # embedded SmolLM2-135M
    doc = load_document(None, lm.tokenizer)             # bundled 'alice'
    table = probe_document(lm, doc, chunks=[parse_chunk("2048:4096")],
                           selections=["entropy:0.1", "attention:0.1", "random:0.1@0-2"])
"""

__version__ = "0.1.0"

from fi_toolkit.documents import Document, load_document, load_documents  # noqa: E402
from fi_toolkit.errors import FIError  # noqa: E402
from fi_toolkit.eviction import KeepMap, TokenSet  # noqa: E402
from fi_toolkit.model.loading import DEFAULT_MODEL, LoadedModel, load_model, tiny_model  # noqa: E402
from fi_toolkit.probe.chunks import Chunk, parse_chunk  # noqa: E402
from fi_toolkit.probe.experiment import probe_document, trace_document  # noqa: E402
from fi_toolkit.probe.forward_influence import forward_influence, forward_influence_by_deletion  # noqa: E402
from fi_toolkit.probe.selections import parse_selections  # noqa: E402
from fi_toolkit.signals.trace import SignalConfig, Trace, trace_prefix  # noqa: E402

__all__ = [
    "Chunk", "DEFAULT_MODEL", "Document", "FIError", "KeepMap", "LoadedModel", "SignalConfig", "TokenSet",
    "Trace", "forward_influence", "forward_influence_by_deletion", "load_document", "load_documents",
    "load_model", "parse_chunk", "parse_selections", "probe_document", "tiny_model", "trace_document",
    "trace_prefix",
]
