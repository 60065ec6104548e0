"""A policy as the command line names it, resolved without importing torch for the project's own
policies (usage errors answer at once): ``kvpress:NAME[:key=value,...]`` goes to the bridge
(:func:`fi_toolkit.integrations.kvpress.bridge.press_policy`, which imports torch and kvpress), every
other name to :func:`fi_toolkit.policies.parse_policy`."""

from __future__ import annotations

KVPRESS_PREFIX = "kvpress:"


def named_policy(
    name: str, budget=None, window: int | None = None, *, where: str = "", shared: tuple[str, ...] = (), **defaults
):
    """``kvpress:NAME[:key=value,...]`` (a press, through the bridge) or one of the project's policies,
    ``NAME[:key=value,...]`` or ``adaptive(NAME)[:...]`` (``defaults``, the global ``--alpha``/``--tau``/
    ``--top-k``, go to the policies that have such fields; the options spelled override them)."""
    if name.strip().lower().startswith(KVPRESS_PREFIX):
        from fi_toolkit.integrations.kvpress.bridge import press_policy

        return press_policy(name, budget, window, where)
    from fi_toolkit.policies import parse_policy

    return parse_policy(name, budget, window, where=where or f"policy {name}", shared=shared, **defaults)
