"""Public names imported on first use (PEP 562), so importing a package (``fi_toolkit``, its ``evaluation``,
``report`` and ``evaluation.lmeval``) loads none of the heavy modules behind them: the command line's help
and argument errors never wait for torch, transformers, pandas or lm-eval."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``'s namespace: ``exports`` maps a public name to the module
    that defines it; the first access imports that module and caches the name in ``package``."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
