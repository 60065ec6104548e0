"""A fitted policy: a linear score of compression-time signals, learned by ``fi fit`` to rank
entries by their per-(layer, KV head) Forward Influence (:mod:`fi_toolkit.fit.ridge`). The signals are
InfoKV's (arXiv 2606.26875: H, D^(l), E^(l)), SnapKV's window attention (arXiv 2404.14469), H2O's
accumulated attention (arXiv 2306.14048), KNorm's key norm (arXiv 2406.11430) and position.

The score of slot ``j`` of layer ``l``, KV head ``h`` is ``sum_f c_f (x_f - mu_f) / sigma_f`` over the
features :data:`FEATURES` (standardisation ``mu``, ``sigma`` and coefficients ``c`` from the fitted
JSON; higher = keep). Every feature is computed from :class:`Signals` alone, at prefill and while
decoding, so the policy never reads a token after the compression point; the one exception is the
entropy under the *other* convention than the signals', which needs the neighbouring position's
entropy: at a prefill the neighbouring slot's, while decoding (where slots are no longer positions) the
tracker's per-position entropies (``Signals.token_entropy``); signals that have neither refuse it.

Spelling: ``fitted:path=FILE`` (``--policy fitted:path=runs/fit/policy.json``, ``--select
policy:fitted@keep=0.25:path=runs/fit/policy.json``); the path may hold neither a comma nor start
with a space. The signals must be traced with the options the file records (window, top-k, pool,
tau, entropy convention); the window and the architecture (layers, KV heads, head size) are checked.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import Policy, as_signals

if TYPE_CHECKING:  # torch is imported where it is used: naming the policy needs none of it
    import torch

    from fi_toolkit.signals.policy_view import Signals

FORMAT = "fi_toolkit.fitted/1"
EPS = 1e-8  # inside the logs of attention masses (window attention is about 1/p per entry)


def _log(x: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.log(x.double() + EPS)


def _positions(s: Signals, layer: int) -> torch.Tensor:
    return s.positions[layer].to(s.keys[layer].device).double()


def _entropy(s: Signals, layer: int, want: str, have: str) -> torch.Tensor:
    """H of each slot's token under convention ``want``, from the signals' ``have`` ``[Hkv, n]``. The other
    convention is the neighbour's value (``H_next(i) = H_produced(i + 1)``, ``H_produced(0) = 0``): at a prefill,
    where slots are positions, the neighbouring slot's; elsewhere (decoding, after a compression) the
    per-position entropies the tracker keeps (``s.token_entropy``), read at each slot's position. Both are known
    once the position is fed: nothing from after the compression point."""
    import torch

    if s.entropy is None:
        raise FIError("the fitted policy needs token entropies; these signals were tracked without them")
    h = s.entropy[layer].double()
    if want == have:
        return h
    n = h.shape[1]
    if not torch.equal(s.positions[layer].cpu(), torch.arange(n).expand_as(s.positions[layer])):
        if s.token_entropy is not None:
            from fi_toolkit.signals.formulas import entropy_of_tokens

            by_position = entropy_of_tokens(s.token_entropy, want).to(h.device)
            return by_position[s.positions[layer].to(h.device)].double()
        raise FIError(
            f"the fitted policy uses entropy_{want}, which is known at a prefill only (the signals "
            f"hold entropy_{have}); fit without it (features='decoding') to compress while decoding"
        )
    if want == "next":  # the last slot's next entropy is unknown; it lies in the window, never ranked
        return torch.cat([h[:, 1:], h[:, -1:]], dim=1)
    return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)


def _needs(s: Signals, name: str, what: str):
    value = getattr(s, name)
    if value is None:
        raise FIError(f"the fitted policy needs {what}; these signals were tracked without it")
    return value


def _layer_entropy(s: Signals, layer: int, tau: float) -> torch.Tensor:
    from fi_toolkit.signals.formulas import layer_entropy_score

    return layer_entropy_score(
        _needs(s, "distance", "D^(l)")[layer].double(), _needs(s, "entropy", "entropies")[layer].double(), tau
    ).double()


# name -> (what it is, function (signals, layer, entropy_of, tau) -> [Hkv, n] float64)
FEATURES: dict[str, tuple[str, object]] = {
    "attention": (
        "window attention A^(l) (pooled)",
        lambda s, l, e, t: _needs(s, "attention", "window attention")[l].double(),
    ),
    "log_attention": ("log(A^(l) + 1e-8)", lambda s, l, e, t: _log(_needs(s, "attention", "window attention")[l])),
    "log_accumulated": (
        "log of the attention received so far (H2O's accumulator) + 1e-8",
        lambda s, l, e, t: _log(_needs(s, "accumulated", "accumulated attention")[l]),
    ),
    "entropy_produced": (
        "H of the distribution that produced the token",
        lambda s, l, e, t: _entropy(s, l, "produced", e),
    ),
    "entropy_next": ("H of the distribution computed at the token", lambda s, l, e, t: _entropy(s, l, "next", e)),
    "distance": ("D^(l) = 1 - cos(h^(l), h^(L))", lambda s, l, e, t: _needs(s, "distance", "D^(l)")[l].double()),
    "layer_entropy": ("E^(l) = (D^(l) + tau) H", lambda s, l, e, t: _layer_entropy(s, l, t)),
    "key_norm": ("L2 norm of the (rotated) key", lambda s, l, e, t: s.keys[l][0].double().norm(dim=-1)),
    "log_recency": ("log(seen - position)", lambda s, l, e, t: (s.seen - _positions(s, l)).log()),
    "log_position": ("log(1 + position)", lambda s, l, e, t: _positions(s, l).log1p()),
}
TOKEN_FEATURES = ("entropy_produced", "entropy_next", "distance", "layer_entropy")  # need H and D per token


def feature_matrix(s: Signals, layer: int, names, entropy_of: str, tau: float) -> torch.Tensor:
    """The features ``names`` of every slot of one layer -> ``[F, Hkv, n_l]`` float64 (``entropy_of``: the
    convention of ``s.entropy``; ``tau``: the bias of ``E^(l)``). The one place features are computed:
    ``fi fit`` builds its training rows with it, the policy scores with it."""
    import torch

    return torch.stack([FEATURES[name][1](s, layer, entropy_of, tau) for name in names])


MAX_MAGNITUDE = 1e100  # a coefficient, mean or scale beyond this is no fit: the score would overflow float64


def _finite_list(data: dict, key: str, n: int, where: str) -> list[float]:
    """``data[key]`` as ``n`` finite numbers (JSON true/false are not numbers) of magnitude at most
    :data:`MAX_MAGNITUDE`; one line naming the key otherwise."""
    values = data.get(key)
    numbers = isinstance(values, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if not numbers or len(values) != n:
        raise FIError(f"{where}: '{key}' must list {n} numbers, one per feature")
    if not all(math.isfinite(v) for v in values):
        raise FIError(f"{where}: '{key}' holds a non-finite value (NaN or inf)")
    if any(abs(v) > MAX_MAGNITUDE for v in values):
        raise FIError(f"{where}: '{key}' holds a value beyond {MAX_MAGNITUDE:g} (the score would overflow)")
    return [float(v) for v in values]


def read_policy_file(path: str | Path, where: str, kind: str, format_: str, maker: str) -> dict:
    """The JSON object of a policy file (fitted or learned) of format ``format_``; a directory, a device, a
    missing file, text that is not JSON or another format is refused in one line naming ``where`` (``maker``:
    the command that writes such files)."""
    path = Path(path)
    if path.is_dir():
        raise FIError(f"{where}: is a directory; name the JSON file {maker} wrote")
    if path.exists() and not path.is_file():
        raise FIError(f"{where}: not a regular file (a device or a pipe); name the JSON file {maker} wrote")
    if not path.exists():
        raise FIError(f"{where}: no such file (make one with {maker})")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FIError(f"{where}: not a {kind} JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != format_:
        raise FIError(f"{where}: not a {kind} JSON (format '{format_}' expected)")
    return data


def check_listed_features(names, known, where: str) -> None:
    """A policy file's ``features``: a non-empty list of ``known`` names, each once."""
    if not isinstance(names, list) or not names:
        raise FIError(f"{where}: no features listed")
    unknown = [n for n in names if not isinstance(n, str) or n not in known]
    if unknown:
        raise FIError(f"{where}: unknown feature {unknown[0]!r} (known: {', '.join(known)})")
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise FIError(f"{where}: the feature '{twice[0]}' is listed twice")


def check_model_and_signals(data: dict, where: str) -> None:
    """Refuse a policy file (fitted or learned) without the model's architecture or the signal settings it was
    trained under (what a run checks it against before using it)."""
    model, signals = data.get("model"), data.get("signals")
    if not isinstance(model, dict) or not all(
        isinstance(model.get(k), int) for k in ("layers", "kv_heads", "head_dim")
    ):
        raise FIError(f"{where}: the model's architecture (layers, kv_heads, head_dim) is missing")
    if (
        not isinstance(signals, dict)
        or not isinstance(signals.get("window"), int)
        or signals.get("entropy_of") not in ("produced", "next")
        or not isinstance(signals.get("tau"), (int, float))
        or not math.isfinite(signals["tau"])
    ):
        raise FIError(f"{where}: the signal settings (window, entropy_of, tau) are missing")


def read_fitted(path: str | Path) -> dict:
    """The fitted JSON at ``path``, checked: format, features known, standardisation and coefficients finite
    (scales > 0), the model's architecture and the signal settings present."""
    where = f"fitted policy '{path}'"
    data = read_policy_file(path, where, "fitted-policy", FORMAT, "fi fit")
    names = data.get("features")
    check_listed_features(names, FEATURES, where)
    for key in ("mean", "scale", "coefficients"):
        _finite_list(data, key, len(names), where)
    if min(data["scale"]) < 1 / MAX_MAGNITUDE:
        raise FIError(f"{where}: 'scale' must be positive (at least {1 / MAX_MAGNITUDE:g})")
    check_model_and_signals(data, where)
    return data


@dataclass
class Fitted(Policy):
    """Keep the entries with the highest fitted score (module docstring); ``path``: the ``fi fit`` JSON.
    ``window`` (0, the default) is the one the file was fitted with."""

    window: int = 0  # 0: the window the file was fitted with
    path: str = ""

    name: ClassVar[str] = "fitted"
    no_layer_weight: ClassVar[str] = (
        "ranks by a fitted score of within-head contrasts, not a mass to share layer budgets by"
    )

    def __post_init__(self):
        if not self.path:
            raise FIError("fitted needs the fitted JSON: fitted:path=FILE (made by fi fit)")
        self.fit = read_fitted(self.path)
        fitted_window = self.fit["signals"]["window"]
        self.window = self.window or fitted_window
        super().__post_init__()
        if self.window != fitted_window:
            raise FIError(f"fitted policy '{self.path}' was fitted with window {fitted_window}, not {self.window}")
        used = [n for n, c in zip(self.fit["features"], self.fit["coefficients"]) if c != 0]
        self.needs_token_signals = any(n in TOKEN_FEATURES for n in used)
        self.tracks_accumulated = "log_accumulated" in used

    def _check_architecture(self, s: Signals) -> None:
        want = self.fit["model"]
        got = {"layers": s.num_layers, "kv_heads": int(s.keys[0].shape[1]), "head_dim": int(s.keys[0].shape[-1])}
        if s.model is not None and isinstance(want.get("vocab"), int):
            got["vocab"] = int(s.model.config.vocab_size)
        for key, value in got.items():
            if want.get(key) != value:
                raise FIError(
                    f"fitted policy '{self.path}' was fitted on {want.get('name', 'another model')} "
                    f"({key} {want.get(key)}), this model has {key} {value}: fit it on this model"
                )

    def _features(self, s: Signals, layer: int) -> torch.Tensor:
        fit = self.fit
        return feature_matrix(s, layer, fit["features"], fit["signals"]["entropy_of"], float(fit["signals"]["tau"]))

    def linear_score(self, s: Signals, layer: int) -> torch.Tensor:
        """``sum_f c_f (x_f - mu_f) / sigma_f`` of every slot -> ``[Hkv, n_l]`` float64."""
        import torch

        fit = self.fit
        x = self._features(s, layer)
        mean, scale, coef = (
            torch.tensor(fit[k], dtype=torch.float64, device=x.device)[:, None, None]
            for k in ("mean", "scale", "coefficients")
        )
        return ((x - mean) / scale * coef).sum(dim=0)

    def scores(self, s: Signals, layer: int) -> torch.Tensor:
        """Dense ranks of :meth:`linear_score` over the candidate slots ``[protected, n - w)`` (equal scores,
        equal ranks), 0 elsewhere -> ``[Hkv, n_l]`` float32. Ranks carry the float64 order exactly into
        :func:`~fi_toolkit.policies.base.select`, which ranks in float32."""
        import torch

        lo, hi = s.protected[layer], s.slots(layer) - s.window
        z = self.linear_score(s, layer)
        out = torch.zeros(z.shape, dtype=torch.float32, device=z.device)
        candidates = z[:, lo:hi]
        if not torch.isfinite(candidates).all():
            which = "a feature is NaN or inf" if not torch.isfinite(self._features(s, layer)).all() else "it overflows"
            raise FIError(f"fitted policy '{self.path}': non-finite score ({which})")
        for h in range(z.shape[0]):
            out[h, lo:hi] = torch.unique(candidates[h], return_inverse=True)[1].float()
        return out

    def keep_map(self, signals):
        s = as_signals(signals)
        self._check_architecture(s)
        return super().keep_map(s)
