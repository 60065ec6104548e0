"""What differs between transformers releases: the cache keyword (a wrong guess would vanish into **kwargs), GGUF
tokenizers."""

import pytest
import torch
import transformers

from fi_toolkit.errors import FIError
from fi_toolkit.model.compat import cache_keyword, cache_kwargs, gguf_metadata, gguf_tokenizer


class _Old(torch.nn.Module):  # transformers 5.2's spelling
    def forward(self, input_ids=None, past_key_values=None, **kwargs):
        return past_key_values


class _New(torch.nn.Module):  # later 5.x releases
    def forward(self, input_ids=None, cache=None, **kwargs):
        return cache


class _NoCache(torch.nn.Module):
    def forward(self, x, **kwargs):
        return x


def test_keyword_follows_the_signature():
    sentinel = object()
    assert cache_keyword(_Old()) == "past_key_values"
    assert cache_keyword(_New()) == "cache"
    assert _Old()(**cache_kwargs(_Old(), sentinel)) is sentinel
    assert _New()(**cache_kwargs(_New(), sentinel)) is sentinel


def test_no_cache_argument_is_refused():
    with pytest.raises(FIError, match="takes no KV cache argument"):
        cache_keyword(_NoCache())


def test_installed_transformers_fills_the_cache(tiny):
    """With the installed release, a forward through cache_kwargs really fills the cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=tiny.config)
    tiny.model.base_model(input_ids=torch.arange(5)[None], use_cache=True, **cache_kwargs(tiny.model.base_model, cache))
    assert cache.get_seq_length() == 5


# -- the tokenizer of a GGUF file: built alike under every supported transformers ---------------------


@pytest.fixture(scope="module")
def embedded():
    from fi_toolkit.model.loading import embedded_gguf

    return embedded_gguf()


def test_gguf_metadata_reads_the_embedded_file(embedded):
    meta = gguf_metadata(embedded)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30
    assert meta["llama.rope.freq_base"] == 100000.0 and meta["general.languages"] == ["en"]
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.add_bos_token"] is False
    tokens = meta["tokenizer.ggml.tokens"]
    assert (
        len(tokens) == len(meta["tokenizer.ggml.token_type"]) == 49152 and len(meta["tokenizer.ggml.merges"]) == 48900
    )
    assert [tokens[meta[f"tokenizer.ggml.{k}_token_id"]] for k in ("bos", "eos", "padding")] == [
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    ]
    assert set(gguf_metadata(embedded, "tokenizer.ggml.b")) == {"tokenizer.ggml.bos_token_id"}


def test_gguf_metadata_refuses_other_files(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(FIError, match="not a GGUF file"):
        gguf_metadata(path)


def test_gguf_tokenizer_follows_the_file(embedded):
    """transformers 5.2's own build prepends BOS and names <|im_start|> as EOS; this one follows the file."""
    tokenizer = gguf_tokenizer(embedded)
    assert len(tokenizer) == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id) == (
        1,
        2,
        2,
        0,
    )
    text = "Alice was beginning to get very tired\n\n  of sitting -- “so VERY” 123 ✓<|im_end|>"
    ids = tokenizer(text).input_ids
    assert ids[:3] == [7356, 436, 3616]  # no BOS in front
    assert ids[-1] == 2 and tokenizer.decode(ids) == text  # the control token stays whole; byte-level decoding
    assert tokenizer.chat_template.startswith("{% for message in messages %}")


@pytest.mark.smollm
def test_gguf_tokenizer_is_what_later_releases_build(embedded):
    """Identical tokenizer.json to transformers' own build where that follows the file (5.24 checked)."""
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(embedded.parent, gguf_file=embedded.name)
    if theirs.eos_token != "<|im_end|>":
        pytest.skip(
            f"transformers {transformers.__version__} misbuilds byte-level GGUF tokenizers (see "
            f"fi_toolkit.model.compat)"
        )
    assert gguf_tokenizer(embedded).backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()


@pytest.mark.smollm
def test_converted_copy_keeps_the_gguf_tokenizer(smollm, embedded):
    """The saved and reloaded copy the toolkit loads tokenizes like the GGUF tokenizer."""
    text = "Alice was beginning to get very tired<|im_end|>"
    assert smollm.tokenizer(text).input_ids == gguf_tokenizer(embedded)(text).input_ids
    assert (smollm.tokenizer.bos_token_id, smollm.tokenizer.eos_token_id, smollm.tokenizer.pad_token_id) == (1, 2, 2)
