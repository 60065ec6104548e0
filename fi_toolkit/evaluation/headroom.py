"""Replay-KL headroom: the share of the achievable gap in replay KL a policy closes,

    headroom = (KL_random - KL_policy) / (KL_random - KL_oracle),

per future and budget, where ``KL`` is a replay's mean KL (``fi eval``'s ``replays`` table), the oracle is
the decoding FI oracle (``fi-oracle``, :mod:`fi_toolkit.compress.lookahead`) and random the mean over
every ``random[:seed=S]`` row of a document. As the prefill headroom (:mod:`fi_toolkit.probe.headroom`):
the three KLs are means over documents and the ratio of means is bootstrapped over documents
(``scipy.stats.bootstrap``, paired, percentile interval); 1 is the oracle, above 1 better than it (the
oracle is a first-order, per-interval estimate, not the optimum).

The oracle's own noise: where the table also holds the oracle at another label seed (``fi-oracle:seed=1`` replayed
beside ``fi-oracle``; :data:`~fi_toolkit.policies.fi_oracle.LABEL_SEEDS`), that replay is no reference or row of
its own, and beside each row ``oracle_seeds``, ``kl_oracle_seed_sd`` and ``headroom_seed_sd`` give the standard
deviations over the label seeds of the oracle's mean KL and of the headroom with each seed's oracle as the
reference (:func:`fi_toolkit.probe.headroom.seed_noise`; NaN with one seed). Replay the oracle at a second label
seed to have them.
"""

from __future__ import annotations

import pandas as pd

from fi_toolkit.evaluation.replay_runs import FULL
from fi_toolkit.evaluation.summaries import is_oracle
from fi_toolkit.probe.headroom import gap_closed, oracle_seed, seed_noise

RANDOM = "random"
COLUMNS = [
    "future",
    "budget",
    "oracle",
    "policy",
    "n_documents",
    "kl_random",
    "kl_policy",
    "kl_oracle",
    "headroom",
    "ci_low",
    "ci_high",
    "oracle_seeds",
    "kl_oracle_seed_sd",
    "headroom_seed_sd",
]


def replay_headroom(
    replays: pd.DataFrame, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """``fi eval``'s ``replays`` table (document, future, policy, budget, mean_kl) -> one row per future x
    budget x oracle x policy (random, the full cache and the oracle itself included) with ``kl_random``,
    ``kl_policy``, ``kl_oracle`` (means over the documents all three have), ``headroom`` and its bootstrap
    CI (NaN below two documents), and the oracle's noise over its label seeds (module docstring). Empty without an
    oracle or a random row."""
    t = replays[replays["policy"] != FULL]
    rows = []
    for (future, budget), part in t.groupby(["future", "budget"], sort=False):
        names = part["policy"].astype(str)
        random = part[names.str.split(":").str[0] == RANDOM].groupby("document")["mean_kl"].mean()
        per_policy = {p: g.groupby("document")["mean_kl"].mean() for p, g in part.groupby("policy", sort=False)}
        random_names = [p for p in per_policy if str(p).split(":")[0] == RANDOM]
        if random.empty:
            continue
        keyed = {p: oracle_seed(str(p)) for p in per_policy if is_oracle(p)}
        reference_of = {base: p for p, (base, label_seed) in keyed.items() if label_seed == 0}
        other_seeds: dict = {}  # a reference oracle -> its replays at other label seeds
        for p, (base, label_seed) in keyed.items():
            if label_seed and base in reference_of:
                other_seeds.setdefault(reference_of[base], []).append(per_policy[p])
        seeded = {p for p, (base, label_seed) in keyed.items() if label_seed and base in reference_of}
        for oracle in [p for p in keyed if p not in seeded]:
            measured = [(p, v) for p, v in per_policy.items() if p not in random_names and p not in seeded]
            for policy, kl in [(RANDOM, random)] + measured:
                docs = random.index.intersection(kl.index).intersection(per_policy[oracle].index)
                r, s, o = (x[docs].to_numpy(float) for x in (random, kl, per_policy[oracle]))
                headroom, low, high = gap_closed(r, s, o, confidence, resamples, seed)
                draws = [per_policy[oracle], *other_seeds.get(oracle, [])]
                common = docs
                for d in draws:
                    common = common.intersection(d.index)
                kl_sd, headroom_sd = seed_noise(
                    random[common].to_numpy(float),
                    kl[common].to_numpy(float),
                    [d[common].to_numpy(float) for d in draws],
                )
                rows.append(
                    {
                        "future": future,
                        "budget": budget,
                        "oracle": oracle,
                        "policy": policy,
                        "n_documents": len(docs),
                        "kl_random": r.mean(),
                        "kl_policy": s.mean(),
                        "kl_oracle": o.mean(),
                        "headroom": headroom,
                        "ci_low": low,
                        "ci_high": high,
                        "oracle_seeds": len(draws),
                        "kl_oracle_seed_sd": kl_sd,
                        "headroom_seed_sd": headroom_sd,
                    }
                )
    return pd.DataFrame(rows, columns=COLUMNS)
