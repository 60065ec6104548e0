"""Whether a policy's budget can ever evict over a decode of a given length: a check on the arguments alone
(no torch), so the command line refuses an impossible budget before the model loads."""

from __future__ import annotations

from fi_toolkit.errors import FIError


def check_budget(policy, prompt_len: int, max_new_tokens: int, compress_prompt: bool) -> None:
    """Budgets that can never work are errors before any model work."""
    w, budget = policy.window, policy.budget
    protected = 0 if compress_prompt else prompt_len
    compressible = prompt_len + max_new_tokens - protected
    if budget.exceeds(compressible):
        raise FIError(
            f"budget {budget.label} is above the {compressible} tokens it may compress "
            f"({prompt_len} prompt{' (kept)' if protected else ''} + {max_new_tokens} new): "
            "nothing would ever be evicted"
        )
    if budget.kept(compressible) <= w:
        raise FIError(
            f"budget {budget.label} keeps at most {budget.kept(compressible)} of the {compressible} "
            f"tokens it may compress, not above the window of {w}"
        )
