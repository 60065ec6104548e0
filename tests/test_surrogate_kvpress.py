"""The surrogate (:mod:`fi_toolkit.policies.surrogate`) against kvpress's own ``KVzapPress``, which loads the same
directory with ``KVzapModel.from_pretrained``: run by `make test-kvpress` in .venv-kvpress; skipped where kvpress is
not installed.

The oracle is kvpress's own: the scores its ``KVzapPress.score`` computes in its prefill hook, and the keep map the
bridge reads from the cache kvpress left (:func:`~fi_toolkit.integrations.kvpress.bridge.run_press`), on the tiny
random Llama (nothing is downloaded: the press is given the model it would fetch from the hub).
"""

from __future__ import annotations

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from cases import random_surrogate  # noqa: E402
from kvpress.presses.kvzap_press import KVzapModel  # noqa: E402

from fi_toolkit.integrations.kvpress.bridge import run_press  # noqa: E402
from fi_toolkit.policies.surrogate import attention_inputs, read_surrogate, write_surrogate  # noqa: E402
from fi_toolkit.probe.selections import parse_selections  # noqa: E402
from fi_toolkit.signals.config import SignalConfig  # noqa: E402
from fi_toolkit.signals.trace import trace_prefix  # noqa: E402

pytestmark = [pytest.mark.kvpress]

N = 200  # prefix of tiny_ids
R = 0.75  # kvpress's compression_ratio (the share removed): keep=0.25
K = int(N * (1 - R))  # kvpress's count per head (compute_n_kept), the project's keep=0.25 of N (round half up)


def kvzap_press(model, folder, form: str):
    """kvpress's ``KVzapPress`` with the surrogate in ``folder``, as ``post_init_from_model`` would have loaded it
    from the hub (``nvidia/KVzap-{form}-{model name}``): set beforehand, so it never downloads. Its ``score`` is
    recorded per layer (``[Hkv, n]``) as kvpress calls it in its prefill hook."""
    press = kvpress.KVzapPress(compression_ratio=R, model_type=form)
    press.kvzap_model = KVzapModel.from_pretrained(str(folder))
    press.kvzap_model_name = f"nvidia/KVzap-{form}-{model.config.name_or_path.split('/')[-1]}"
    recorded: dict[int, torch.Tensor] = {}
    kvpress_score = press.score

    def score(module, *args, **kwargs):
        out = kvpress_score(module, *args, **kwargs)
        recorded[module.layer_idx] = out[0].detach().clone()
        return out

    press.score = score
    return press, recorded


def ranked(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted positions of the ``k`` highest ``scores [n]``, ties to the earlier position (the project's ``select``)."""
    return torch.sort(torch.sort(scores, descending=True, stable=True).indices[:k]).values


def kept_scores(scores: torch.Tensor, kept) -> torch.Tensor:
    """The scores of the kept positions, sorted: equal for two choices that differ only among tied scores."""
    return torch.sort(scores[torch.as_tensor(sorted(kept), dtype=torch.long)]).values


@pytest.mark.parametrize("hidden", [None, 5], ids=["linear", "mlp"])
def test_kvzap_press_and_the_surrogate_policy_score_and_keep_the_same_entries(tiny, tiny_ids, tmp_path, hidden):
    """One random surrogate, written once, is loaded by kvpress's ``KVzapPress`` (compression_ratio 0.75) and by the
    project's ``surrogate:path=DIR@keep=0.25``, on the same prefix of the same model.

    1. Scores: kvpress's ``KVzapPress.score`` in its prefill hook equals, bit for bit, the project's per-position
       scores (``attention_inputs`` + ``SurrogateModel.score``): the same attention inputs, the same weights.
    2. Keep maps. The conventions differ: kvpress's ``ScorerPress`` keeps each head's ``int(n * (1 - r))`` top-scored
       entries over the whole prefix, while the project's policy always keeps its last ``window`` positions (at
       least 1) and ranks only the rest, for the same ``K`` per head in all. So

       - kvpress's keep map (read by the bridge from the cache kvpress left) is each head's top ``K`` of the
         project's scores over all ``n`` positions (the project's scores under kvpress's convention);
       - the project's keep map with ``window=1`` is, exactly, the last position and each head's top ``K - 1`` of
         kvpress's recorded scores over ``[0, n - 1)`` (kvpress's scores under the project's convention);
       - so the two keep maps keep the same entries on every head whose kvpress top ``K`` holds the last position,
         and on the others differ by one swap only: the project keeps the last position where kvpress keeps its
         ``K``-th best of the rest.

    Ties: at layer 0 a repeated token has the same attention input, so the same score; ``torch.topk`` (kvpress)
    breaks ties in its own order, the project's ``select`` by earlier position. Where kvpress's choice is compared
    it is compared by the scores it kept (sorted): two choices that differ only among tied scores are the same.
    """
    model = tiny.model
    folder = write_surrogate(tmp_path / "s", random_surrogate(tiny, hidden))
    form = "linear" if hidden is None else "mlp"

    press, theirs_scores = kvzap_press(model, folder, form)
    theirs = run_press(press, model, tiny_ids, N, f"KVzapPress({form})").keep_map
    assert sorted(theirs_scores) == list(range(4)) and theirs.counts() == [K] * 4

    m = read_surrogate(folder)
    inputs = attention_inputs(model, tiny_ids[:N])
    ours_scores = [m.score(layer, x).t() for layer, x in enumerate(inputs)]  # [Hkv, N]
    for layer in range(4):
        assert theirs_scores[layer].shape == (2, N)
        torch.testing.assert_close(theirs_scores[layer], ours_scores[layer], rtol=0, atol=0)

    trace = trace_prefix(model, tiny_ids, N, SignalConfig(window=1))
    (sel,) = parse_selections([f"policy:surrogate@keep={1 - R}:path={folder}"])
    ours = sel.resolve(trace, model=model, ids=tiny_ids)
    assert ours.counts() == [K] * 4

    last = torch.tensor([N - 1])
    cases = {"same": 0, "swap": 0}
    for layer in range(4):
        for h in range(2):
            s = ours_scores[layer][h]
            a, b = set(ours.keep[layer][h].tolist()), set(theirs.keep[layer][h].tolist())
            # kvpress's convention, the project's scores: its top K (ties broken by torch.topk, not by position)
            assert torch.equal(kept_scores(s, b), torch.sort(s).values[-K:])
            # the project's convention, kvpress's scores: the last position and the top K - 1 of the rest
            want = torch.cat([ranked(theirs_scores[layer][h, : N - 1], K - 1), last])
            assert torch.equal(ours.keep[layer][h], want)
            if N - 1 in b:  # kvpress kept the project's window too: the same entries (up to tied scores)
                assert torch.equal(kept_scores(s, a), kept_scores(s, b))
                cases["same"] += 1
            else:  # one swap: kvpress's K-th best candidate for the project's window
                kth = torch.sort(s[: N - 1], descending=True).values[K - 1]
                assert N - 1 in a and s[N - 1] < kth
                assert torch.equal(
                    kept_scores(s, b), torch.sort(torch.cat([kept_scores(s, a - {N - 1}), kth[None]])).values
                )
                cases["swap"] += 1
    assert cases["same"] and cases["swap"], cases  # both conventions' cases met (fixed seeds: not by chance)
