"""The cache keyword is read from the forward signature: a wrong guess would vanish into **kwargs."""

import pytest
import torch

from fi_toolkit.compat import cache_keyword, cache_kwargs
from fi_toolkit.errors import FIError


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
