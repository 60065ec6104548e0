"""Model loading: the embedded GGUF is converted once, cached, and the copy is the same model."""

from __future__ import annotations

import pytest
import torch

from fi_toolkit.errors import FIError
from fi_toolkit.model.loading import embedded_gguf, load_model, resolve_device, resolve_dtype


@pytest.mark.smollm
def test_first_load_converts_and_later_loads_hit_the_cached_copy(tmp_path, monkeypatch, smollm, capfd):
    import transformers

    monkeypatch.setenv("FI_TOOLKIT_CACHE", str(tmp_path))
    gguf_reads = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        if kwargs.get("gguf_file"):
            gguf_reads.append(kwargs["gguf_file"])
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    capfd.readouterr()
    first = load_model()
    assert len(gguf_reads) == 1  # converted once
    assert capfd.readouterr().err == ""  # silently: no progress bar may break the CLI's one-line messages
    copies = list((tmp_path / "models").glob(f"{embedded_gguf().stem}-*"))
    assert len(copies) == 1 and (copies[0] / "model.safetensors").exists()
    assert not list((tmp_path / "models").glob(".staging-*"))  # the atomic rename left no debris
    stamp = (copies[0] / "model.safetensors").stat().st_mtime_ns
    second = load_model()
    assert len(gguf_reads) == 1  # the cache hit: no second GGUF read (no timing, which flakes on a busy machine)
    assert (copies[0] / "model.safetensors").stat().st_mtime_ns == stamp
    # another transformers version never reuses the copy (its saved tokenizer may not load the same)
    monkeypatch.setattr(transformers, "__version__", "0.0.0-other")
    load_model()
    assert len(gguf_reads) == 2
    assert len(list((tmp_path / "models").glob(f"{embedded_gguf().stem}-*"))) == 2
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


def test_the_tokenizer_json_counts_what_the_loaded_tokenizer_counts(tmp_path):
    """A checkpoint's tokenizer.json, read by the tokenizers library alone (what measures documents before the
    weights load), counts what transformers' tokenizer of the same directory counts: the BOS its post-processor
    adds included, a max_length saved in the file ignored."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from fi_toolkit.model.files import token_counter

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "a": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.enable_truncation(8)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>")
    fast.save_pretrained(tmp_path)
    count, loaded = token_counter(str(tmp_path)), transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ("a", "a a b, c!", "a word " * 50):
        assert count(text) == len(loaded(text)["input_ids"]), text
    assert count("a word " * 50) == 101
