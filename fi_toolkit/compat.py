"""What differs between the supported transformers releases, resolved in one place.

transformers 5.2 names a forward's cache argument ``past_key_values``; later 5.x releases name it
``cache``. Passing the wrong name does not fail: it vanishes into ``**kwargs`` and the cache stays
empty. So the name is read once per model class from its forward signature, and every call site
passes the cache through :func:`cache_kwargs`.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .errors import FIError

CACHE_KEYWORDS = ("cache", "past_key_values")  # newest first


@functools.lru_cache(maxsize=None)
def _cache_keyword(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    raise FIError(f"{cls.__name__}.forward takes no KV cache argument ({' or '.join(CACHE_KEYWORDS)})")


def cache_keyword(module: torch.nn.Module) -> str:
    """The name ``module.forward`` gives its KV cache argument."""
    return _cache_keyword(type(module))


def cache_kwargs(module: torch.nn.Module, cache) -> dict:
    """``{name: cache}`` for ``module(**...)``, with the name its transformers release uses."""
    return {cache_keyword(module): cache}
