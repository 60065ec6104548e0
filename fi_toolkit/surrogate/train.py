"""``fi fit-surrogate``: train the surrogate (:mod:`fi_toolkit.policies.surrogate`) on the label factory's runs.

For every slice of every run (``fi labels``' units, grouped by slice) the model runs one forward of the slice's
tokens with hooks on every layer's attention input (:func:`~fi_toolkit.policies.surrogate.attention_inputs`);
each unit's row of layer ``l``, KV head ``h`` and position ``j`` pairs the hidden state ``x_l[j]`` with the FI
label. Per layer, one model maps ``x`` to the ``Hkv`` scores (:class:`SurrogateFitSettings` for the choices):

- ``linear`` with ``log`` or ``weighted``: ridge regression of ``log FI`` on the standardised hidden states,
  solved in closed form from running sums (every row used, exact, float64; ``weighted``: each row weighted by
  its FI over its (unit, layer, head)'s mean, one solve per head);
- the target: FI (``fi``, ``fi_near``, ``fi_far``), or ``kvzip_plus``, KVzip+ scores computed here for the
  unit's prefix (:mod:`~fi_toolkit.surrogate.kvzip_plus`): KVzap's recipe, the like-for-like anchor;
- ``mlp``, or ``listwise``: Adam on a seeded sample of ``positions`` positions per unit (the rows of all KV
  heads at a sampled position stay together), full batch or minibatches of ``batch_units`` whole units.

The result is kvpress's KVzap format (``config.json`` + ``model.safetensors``) with the training's record in
``config.json``'s ``fi_toolkit`` entry (runs, units, labels, settings). Same runs, settings and thread count:
the same bytes.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from fi_toolkit.errors import FIError
from fi_toolkit.runs.settings import check_type
from fi_toolkit.surrogate.train_settings import KVZIP_PLUS, SurrogateFitSettings

if TYPE_CHECKING:
    import torch

    from fi_toolkit.policies.surrogate import SurrogateModel

LOG_FLOOR = 1e-30  # FI estimates are positive; the floor only guards log(0)
Progress = Callable[[str, int, int], None]


def _unit_arrays(labels, target: str, n_layers: int, n_heads: int, teacher=None):
    """A unit's ``positions [m]`` and its target ``[L, m, Hkv]`` (float64) from its rows (layer, head, position
    order): the FI column ``target``, or with ``teacher(point) -> [L, Hkv, point]`` (KVzip+) the teacher's scores
    at the rows' positions."""
    import numpy as np

    m = len(labels) // (n_layers * n_heads)
    if m * n_layers * n_heads != len(labels) or not (labels.layer.to_numpy()[:m] == 0).all():
        raise FIError("a labels table is not one row per (layer, KV head, position) in that order")
    positions = labels.position.to_numpy()[:m]
    if teacher is not None:
        scores = teacher(int(labels.point.iloc[0])).double().numpy()
        return positions, scores[:, :, positions].transpose(0, 2, 1)
    fi = labels[target].to_numpy(dtype=np.float64).reshape(n_layers, n_heads, m).transpose(0, 2, 1)
    return positions, fi


def _slices(runs: Sequence[Path]) -> list[tuple[str, list[tuple[Path, str]]]]:
    """Units grouped by slice: ``(slice key, [(run, unit)...])`` in run and unit order."""
    from fi_toolkit.surrogate.labels import finished_units, slice_key

    groups: dict = {}
    for run in runs:
        for unit in finished_units(run):
            groups.setdefault((str(run), slice_key(unit)), []).append((run, unit))
    return [(key[1], units) for key, units in groups.items()]


class _Sums:
    """Running sums of one layer's rows for the closed-form ridge (float64): all heads share ``x``; with
    weights, one set of sums per head."""

    def __init__(self, d: int, h: int, weighted: bool):
        import torch

        self.weighted = weighted
        k = h if weighted else 1
        self.n = torch.zeros(k, dtype=torch.float64)
        self.sx = torch.zeros(k, d, dtype=torch.float64)
        self.sxx = torch.zeros(k, d, d, dtype=torch.float64)
        self.sy = torch.zeros(h, dtype=torch.float64)
        self.sxy = torch.zeros(d, h, dtype=torch.float64)

    def add(self, x: torch.Tensor, fi: torch.Tensor) -> None:
        """``x [m, d]``, ``fi [m, Hkv]`` (float64)."""
        import torch

        y = torch.log(fi.clamp_min(LOG_FLOOR))
        x32 = x.float()  # one unit's Gram matrix in float32 (its ~1,000 rows), the running sums in float64
        if not self.weighted:
            self.n += x.shape[0]
            self.sx += x.sum(0)
            self.sxx += (x32.t() @ x32).double()
            self.sy += y.sum(0)
            self.sxy += x.t() @ y
            return
        w = fi / fi.mean(0, keepdim=True)  # [m, H]: each head's rows by their FI over the head's mean
        self.n += w.sum(0)
        self.sx += w.t() @ x
        for h in range(w.shape[1]):
            self.sxx[h] += ((x32 * w[:, h, None].float()).t() @ x32).double()
        self.sy += (w * y).sum(0)
        self.sxy += x.t() @ (w * y)

    def solve(self, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W [Hkv, d], b [Hkv])`` of the ridge regression on standardised inputs (intercept not penalised)."""
        import torch

        heads = self.sy.shape[0]
        weights, biases = [], []
        for h in range(heads):
            k = h if self.weighted else 0
            n = self.n[k]
            mu = self.sx[k] / n
            cov = self.sxx[k] / n - torch.outer(mu, mu)
            ybar = self.sy[h] / n
            cxy = self.sxy[:, h] / n - mu * ybar
            sd = cov.diagonal().clamp_min(0).sqrt().clamp_min(1e-12)
            a = cov / torch.outer(sd, sd) + ridge * torch.eye(cov.shape[0], dtype=cov.dtype)
            w = torch.linalg.solve(a, cxy / sd) / sd
            weights.append(w)
            biases.append(ybar - mu @ w)
        return torch.stack(weights), torch.stack(biases)


def _train_adam(x, fi, groups, settings: SurrogateFitSettings, heads: int, generator) -> dict:
    """One layer's module by Adam, full batch or by minibatches of whole units: ``x [N, d]`` float32, ``fi [N,
    Hkv]`` float64, ``groups [N]`` the unit of each row (ascending). Returns its tensors by kvpress's names
    (without the ``layers.<l>.`` prefix)."""
    import torch

    d = x.shape[1]
    if settings.form == "linear":
        net = torch.nn.Linear(d, heads)
    else:
        net = torch.nn.Sequential(
            torch.nn.Linear(d, settings.hidden), torch.nn.GELU(), torch.nn.Linear(settings.hidden, heads)
        )
    with torch.no_grad():  # seeded initialisation, independent of torch's global generator
        for p in net.parameters():
            bound = 1 / (p.shape[-1] ** 0.5) if p.dim() > 1 else 1e-3
            p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=generator))
    mean, sd = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / sd
    y = torch.log(fi.clamp_min(LOG_FLOOR)).float()
    w = (fi / _group_mean(fi, groups)).float()
    share = (fi / _group_sum(fi, groups)).float()
    last = net if settings.form == "linear" else net[2]
    if settings.loss != "listwise":  # start at each head's (weighted) mean log FI: far from 0 (log 1e-6 = -14)
        with torch.no_grad():
            last.bias.copy_((w * y).sum(0) / w.sum(0) if settings.loss == "weighted" else y.mean(0))
    opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
    for _ in range(settings.epochs):
        for rows in _batches(groups, settings.batch_units, generator):
            part = slice(None) if rows is None else rows
            opt.zero_grad()
            s = net(z[part])
            if settings.loss == "listwise":
                loss = _listwise(s, share[part], torch.unique(groups[part], return_inverse=True)[1])
            elif settings.loss == "weighted":
                loss = (w[part] * (s - y[part]) ** 2).mean()
            else:
                loss = ((s - y[part]) ** 2).mean()
            loss.backward()
            opt.step()
    # fold the standardisation into the first layer, so the module reads raw hidden states as kvpress feeds them
    first = net if settings.form == "linear" else net[0]
    with torch.no_grad():
        weight = first.weight / sd
        bias = first.bias - weight @ mean
    if settings.form == "linear":
        return {"weight": weight, "bias": bias}
    return {"0.weight": weight, "0.bias": bias, "2.weight": net[2].weight.detach(), "2.bias": net[2].bias.detach()}


def _batches(groups, units: int, generator):
    """One epoch's minibatches: the row indices of ``units`` whole units at a time, the units in a seeded random
    order (a unit's rows stay together: the listwise loss ranks within it); ``units`` 0: one full batch (None)."""
    import torch

    if units == 0:
        yield None
        return
    n_units = int(groups.max()) + 1
    starts = torch.searchsorted(groups, torch.arange(n_units + 1))  # the rows are grouped by unit, in order
    order = torch.randperm(n_units, generator=generator)
    for i in range(0, n_units, units):
        yield torch.cat([torch.arange(starts[u], starts[u + 1]) for u in order[i : i + units].tolist()])


def _group_sum(fi, groups):
    import torch

    sums = torch.zeros(int(groups.max()) + 1, fi.shape[1], dtype=fi.dtype).index_add_(0, groups, fi)
    return sums[groups]


def _group_mean(fi, groups):
    import torch

    counts = torch.bincount(groups).to(fi.dtype)[:, None]
    return _group_sum(fi, groups) / counts[groups]


def _listwise(scores, share, groups):
    """ListNet's loss per (unit, KV head): ``-sum_j q_j log softmax(s)_j`` with ``q`` FI's shares, averaged."""
    import torch

    n_groups = int(groups.max()) + 1
    top = torch.full((n_groups, scores.shape[1]), -torch.inf).scatter_reduce(
        0, groups[:, None].expand_as(scores), scores.detach(), "amax"
    )
    e = torch.exp(scores - top[groups])
    log_norm = torch.log(torch.zeros(n_groups, scores.shape[1]).index_add(0, groups, e)) + top
    return -(share * (scores - log_norm[groups])).sum() / (n_groups * scores.shape[1])


def run_fit_surrogate(
    lm,
    runs: Sequence[Path | str] | Path | str,
    settings: SurrogateFitSettings,
    out: Path | str | None = None,
    *,
    max_slices: int | None = None,
    progress: Progress | None = None,
    teacher_cache: dict | None = None,
) -> SurrogateModel:
    """Train the surrogate on the units of ``runs`` (``fi labels`` run directories) -> the model (written to the
    directory ``out`` when given; its ``about`` holds the training's record). ``max_slices``: only the first so
    many slices (a learning curve's points). ``teacher_cache``: a dict that keeps the KVzip+ scores of each
    (run, unit) across calls (a learning curve computes each unit's teacher once)."""
    import numpy as np
    import torch

    from fi_toolkit.policies.surrogate import SurrogateModel, attention_inputs, write_surrogate
    from fi_toolkit.surrogate.kvzip_plus import kvzip_plus_scores, repeat_prompt
    from fi_toolkit.surrogate.labels import read_unit

    settings = check_type("settings", settings, SurrogateFitSettings).check()
    runs = [Path(r) for r in ([runs] if isinstance(runs, (str, Path)) else runs)]
    if not runs:
        raise FIError("no fi labels run given", parameter="runs")
    cfg = lm.config
    n_layers, n_heads, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size
    slices = _slices(runs)[:max_slices]
    sums = [_Sums(d, n_heads, settings.loss == "weighted") for _ in range(n_layers)] if settings.closed_form else None
    rows: list[list] = [[] for _ in range(n_layers)]  # per layer (x, fi, group) blocks for Adam
    labels_used, group = 0, 0  # group: the units seen so far, each its own group (and sample seed)
    cache = {} if teacher_cache is None else teacher_cache
    for done, (_name, units) in enumerate(slices):
        tables = [read_unit(run, unit) for run, unit in units]
        tokens = torch.tensor(read_unit(units[0][0], units[0][1], "tokens").token.to_numpy())
        end = max(int(t.point.iloc[0]) for t in tables)
        inputs = attention_inputs(lm.model, tokens[:end])
        teacher = None
        if settings.target == KVZIP_PLUS:

            def teacher(point, tokens=tokens, key=(str(units[0][0]), _name), cache=cache):
                if (*key, point) not in cache:
                    cache[(*key, point)] = kvzip_plus_scores(lm.model, repeat_prompt(lm.tokenizer, tokens[:point]))
                return cache[(*key, point)]

        for labels in tables:
            positions, fi = _unit_arrays(labels, settings.target, n_layers, n_heads, teacher)
            labels_used += fi.size
            if not settings.closed_form:
                rng = np.random.default_rng([settings.seed, group])
                pick = np.sort(rng.choice(len(positions), min(settings.positions, len(positions)), replace=False))
                positions, fi = positions[pick], fi[:, pick]
            for layer in range(n_layers):
                x = inputs[layer][torch.tensor(positions)].double()
                f = torch.tensor(fi[layer])
                if sums is not None:
                    sums[layer].add(x, f)
                else:
                    rows[layer].append((x.float(), f, torch.full((len(positions),), group, dtype=torch.long)))
            group += 1
        if progress:
            progress("slices", done + 1, len(slices))
    weights = {}
    generator = torch.Generator().manual_seed(settings.seed)
    for layer in range(n_layers):
        if sums is not None:
            w, b = sums[layer].solve(settings.ridge)
            part = {"weight": w, "bias": b}
        else:
            x, f, g = (torch.cat(t) for t in zip(*rows[layer]))
            part = _train_adam(x, f, g, settings, n_heads, generator)
        weights.update({f"layers.{layer}.{k}": v.float() for k, v in part.items()})
        if progress:
            progress("layers", layer + 1, n_layers)
    about = {
        "trained_on": "KVzip+ scores (kvzap's teacher)"
        if settings.target == KVZIP_PLUS
        else "Forward Influence (fi labels)",
        "model": lm.name,
        "settings": asdict(settings),
        "runs": [str(r) for r in runs],
        "units": group,
        "labels": int(labels_used),
    }
    model = SurrogateModel(d, n_heads, n_layers, settings.hidden if settings.form == "mlp" else None, weights, about)
    if out is not None:
        write_surrogate(out, model)
    return model
