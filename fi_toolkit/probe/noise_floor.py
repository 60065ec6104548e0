"""The noise floor (docs/method.md, "Noise floor"): the one rule for how much FI rounding alone
produces, and which values are too small to be told from it.

- The controls: two evictions that change nothing mathematically (:func:`noise_controls`).
- The floor of a chunk: the largest ``|FI|`` of its controls (:func:`control_floor` on a
  :class:`~fi_toolkit.probe.forward_influence.ProbeResult`'s tensor, :func:`noise_floor` on a table).
- Below the floor: ``value < NOISE_MARGIN x floor`` (:func:`below_margin`), float32 for FI, as the
  probe computes it; a missing (NaN) floor flags nothing.
- ``fi eval``: the full-cache replay, which changes nothing either, is the control of the compressed
  replays; its ``|mean KL|`` per document and future is their floor (:func:`text_noise_floor`).

Every command reports the flagged rows in one warning line (:func:`fi_toolkit.report.noise.noise_warning`,
:func:`fi_toolkit.report.noise.replay_noise_warning`), printed by :func:`fi_toolkit.cli.console.print_warning`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from fi_toolkit.eviction import KeepMap, TokenSet

CONTROL = "control"  # the selector of the noise-floor controls
NOISE_MARGIN = 10.0  # rows whose FI is below NOISE_MARGIN x the noise floor are flagged
CONTROL_LABELS = (f"{CONTROL}:null", f"{CONTROL}:reorder")  # what noise_controls returns, in order


def noise_controls(prefix_len: int, num_layers: int, num_kv_heads: int) -> list[TokenSet | KeepMap]:
    """Two evictions that change nothing mathematically, so their FI is the path's rounding alone.

    ``control:null`` removes nothing and runs in the first batch of the masked path with the real
    token sets: it is exactly 0 whenever that path computes what the reference computes, so anything
    else is a fault of the path. ``control:reorder`` keeps every entry, in reverse order, through the
    gather path: attention sums over keys in any order (RoPE is already in the cached keys), so only
    the summation order changes and its FI measures how much the arithmetic's rounding alone moves
    the distributions (float32: ~1e-10 nats; bfloat16 arithmetic: ~1e-3).
    """
    meta = {"selector": CONTROL}
    reverse = torch.arange(prefix_len - 1, -1, -1)
    null, reorder = CONTROL_LABELS
    return [
        TokenSet(null, torch.empty(0, dtype=torch.long), dict(meta)),
        KeepMap(reorder, [reverse.expand(num_kv_heads, -1).clone() for _ in range(num_layers)], dict(meta)),
    ]


def is_control(eviction) -> bool:
    """Whether ``eviction`` (a token set or keep map) is one of the :func:`noise_controls`."""
    return eviction.meta.get("selector") == CONTROL


def below_margin(values, floor):
    """``values < NOISE_MARGIN x floor`` elementwise, in the arguments' dtype (torch tensors or numpy
    arrays that broadcast; FI is float32). A NaN floor flags nothing."""
    return values < NOISE_MARGIN * floor


def control_floor(fi: torch.Tensor, rows: Sequence[int]) -> torch.Tensor | None:
    """``fi [E, C]`` -> ``[C]``: the largest ``|FI|`` of the control ``rows`` per chunk, or None without controls."""
    return fi[list(rows)].abs().max(dim=0).values if len(rows) else None


def noise_floor(table: pd.DataFrame) -> dict:
    """``{document: {chunk: floor}}``: the largest ``|fi|`` of a tidy FI table's control rows
    (``selector == CONTROL``) per document and chunk."""
    controls = table[table["selector"] == CONTROL]
    floors = controls.assign(fi=controls["fi"].abs()).groupby(["document", "chunk"], sort=False)["fi"].max()
    out: dict = {}
    for (doc, chunk), value in floors.items():
        out.setdefault(doc, {})[chunk] = float(value)
    return out


def flag_below_noise_floor(table: pd.DataFrame, floors: dict | None = None) -> pd.DataFrame:
    """``table`` with ``below_noise_floor`` (after ``fi``) set for every row, as
    :meth:`ProbeResult.below_noise_floor` sets it (float32 ``fi < NOISE_MARGIN x floor``, per document
    and chunk): for a document measured in parts, of which only the first holds the controls.
    ``floors``: :func:`noise_floor` of the table holding the controls (default ``table`` itself)."""
    fi = table["fi"].to_numpy(dtype=np.float32)
    floors = noise_floor(table) if floors is None else floors
    floor = np.array(
        [floors.get(d, {}).get(c, np.nan) for d, c in zip(table["document"], table["chunk"])], dtype=np.float32
    )
    below = pd.Series(below_margin(fi, floor), index=table.index)
    out = table.drop(columns="below_noise_floor", errors="ignore")
    out.insert(out.columns.get_loc("fi") + 1, "below_noise_floor", below)
    return out


def text_noise_floor(replays: pd.DataFrame, full: str) -> dict:
    """``fi eval``'s floor: ``{document: {future: |mean_kl| of the replay whose policy is full}}``
    (``full``: the full-cache replay's label, :data:`fi_toolkit.evaluation.replay_runs.FULL`)."""
    rows = replays[replays["policy"] == full]
    return {
        d: {f: abs(float(v)) for f, v in zip(part["future"], part["mean_kl"])} for d, part in rows.groupby("document")
    }


def text_future_floor(replays: pd.DataFrame, full: str) -> dict:
    """``{future: the largest floor over documents}`` (:func:`text_noise_floor`), for summaries across documents."""
    pairs = [(future, floor) for per in text_noise_floor(replays, full).values() for future, floor in per.items()]
    return pd.DataFrame(pairs, columns=["future", "floor"]).groupby("future", sort=False)["floor"].max().to_dict()


def text_below_noise_floor(replays: pd.DataFrame, full: str) -> pd.Series:
    """Bool per compressed replay (policy other than ``full``, indexed as in ``replays``): ``|mean_kl|
    < NOISE_MARGIN x`` its document's and future's :func:`text_noise_floor` (float64)."""
    floors = text_noise_floor(replays, full)
    rows = replays[replays["policy"] != full]
    floor = np.array(
        [floors.get(d, {}).get(f, np.nan) for d, f in zip(rows["document"], rows["future"])], dtype=np.float64
    )
    kl = np.abs(rows["mean_kl"].to_numpy(dtype=np.float64))
    return pd.Series(below_margin(kl, floor), index=rows.index, dtype=bool)
