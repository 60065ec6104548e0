"""Token classes: is a selector's set made of content words or function words?

A closed-class English function-word list (determiners, pronouns, prepositions, conjunctions,
auxiliaries, particles) is enough for the question; no tagger is needed. A token is classified by
its text with surrounding whitespace removed and lower-cased: in the list -> ``function``; no
letter at all (punctuation, digits, whitespace, newlines) -> ``other``; anything else (including
sub-word pieces) -> ``content``.
"""

from __future__ import annotations

import pandas as pd

FUNCTION_WORDS = frozenset(
    """
a an the this that these those my your his her its our their whose which what whatever
i me you he him she it we us they them myself yourself himself herself itself ourselves themselves
mine yours hers ours theirs one ones someone something anyone anything nobody nothing everyone everything
who whom whoever
and or but nor so yet for if then else than because although though while whereas unless until since
as whether either neither both
of in on at by to from with without within into onto upon over under above below about after before
between among through during against across along around behind beyond toward towards near off out up down
per via like unlike despite except
be am is are was were been being have has had having do does did done doing
will would shall should can could may might must ought
not no yes nay all any some each every few many much more most less least other another such own same
very too also just only even still again ever never here there where when why how
there's it's i'm don't can't won't isn't wasn't didn't doesn't i'll i've you're they're we're
's 't 'll 're 've 'd 'm n't
thee thou thy thine ye o oh ah
""".split()
)

CLASSES = ("content", "function", "other")


def token_class(text: str) -> str:
    word = text.strip().lower()
    if not any(ch.isalpha() for ch in word):
        return "other"
    return "function" if word in FUNCTION_WORDS else "content"


def class_shares(texts: list[str]) -> dict:
    """Counts and shares of each class among ``texts``."""
    counts = {c: 0 for c in CLASSES}
    for t in texts:
        counts[token_class(t)] += 1
    total = max(1, len(texts))
    return {
        "n_tokens": len(texts),
        **{f"n_{c}": counts[c] for c in CLASSES},
        **{f"share_{c}": counts[c] / total for c in CLASSES},
    }


def token_class_table(rows: list[dict]) -> pd.DataFrame:
    """``rows``: dicts with identifying columns plus ``texts`` (the set's token strings)."""
    return pd.DataFrame([{**{k: v for k, v in r.items() if k != "texts"}, **class_shares(r["texts"])} for r in rows])
