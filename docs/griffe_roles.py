"""A griffe extension: Sphinx roles in fi_toolkit's docstrings (:func:`x`, :class:`x`, :mod:`x`, ...) become
Markdown code spans, so mkdocstrings renders them as code instead of raw role text."""

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):`~?([^`]+)`")


def roles_to_code(text: str) -> str:
    """``:func:`trace_prefix``` -> ```trace_prefix```; a leading ``~`` (Sphinx's short form) is dropped."""
    return ROLE.sub(lambda m: f"`{m.group(1)}`", text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = roles_to_code(obj.docstring.value)
