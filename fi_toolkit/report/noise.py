"""The noise floor in words: the one warning line a run prints when some of its values sit below
``NOISE_MARGIN`` x the noise floor (the floors themselves are :mod:`fi_toolkit.probe.noise_floor`'s). Words for a
person are the report's; the command line prints what these return.
"""

from __future__ import annotations

import pandas as pd

from fi_toolkit.evaluation.replay_runs import FULL
from fi_toolkit.probe.noise_floor import CONTROL, NOISE_MARGIN, noise_floor, text_below_noise_floor
from fi_toolkit.report.numbers import significant

BELOW_FLOOR_MARK = "†"  # beside a value below NOISE_MARGIN x its noise floor where no column says so (a mean)


def below_floor_note(table: pd.DataFrame) -> str:
    """The footnote of a table whose values below ``NOISE_MARGIN`` x the noise floor carry
    :data:`BELOW_FLOOR_MARK` (``table``: the tidy FI table, controls included). The controls' own values
    carry it too: they are the floor, and a negative one is round-off of a KL that is never below 0."""
    floors = [v for chunks in noise_floor(table).values() for v in chunks.values()]
    top = f", up to {significant(max(floors), 2)} nats" if floors else ""
    return (
        f"{BELOW_FLOOR_MARK} below {significant(NOISE_MARGIN)}x the noise floor (the controls' largest |FI|{top}): "
        "rounding, not the eviction; FI < 0 is round-off"
    )


def noise_warning(table: pd.DataFrame, controls: pd.DataFrame | None = None) -> str | None:
    """One line when any measured (non-control) row of a tidy FI table is below ``NOISE_MARGIN`` x its noise
    floor (``controls``: the table holding the control rows, default ``table`` itself)."""
    if "below_noise_floor" not in table:
        return None
    floors = noise_floor(table if controls is None else controls)
    measured = table[table["selector"] != CONTROL] if "selector" in table else table
    flagged = measured["below_noise_floor"].astype(bool)
    if not flagged.any():
        return None
    top = max(v for chunks in floors.values() for v in chunks.values())
    return (
        f"warning: {int(flagged.sum())} of {len(measured)} FI values are below {significant(NOISE_MARGIN)}x the noise "
        f"floor (up to {significant(top, 2)} nats); they measure rounding, not the eviction (column below_noise_floor)"
    )


def replay_noise_warning(replays: pd.DataFrame, full: str = FULL) -> str | None:
    """``fi eval``'s line when any compressed replay is below ``NOISE_MARGIN`` x its full-cache replay's mean KL
    (``full``: that replay's policy label)."""
    below = text_below_noise_floor(replays, full)
    if not below.any():
        return None
    first = replays[replays["policy"] != full][below.to_numpy()].iloc[0]
    return (
        f"warning: {int(below.sum())} of {len(below)} compressed replays have a mean KL below "
        f"{significant(NOISE_MARGIN)}x the full-cache replay's (the noise floor), e.g. "
        f"{first['policy']}@{first['budget']} on {first['document']}"
    )
