"""A learned policy: a LightGBM LambdaRank model (``fi fit --learner lambdarank``) that ranks the entries of
each (layer, KV head) by a score of compression-time features, trained on within-head ranks of Forward
Influence (:mod:`fi_toolkit.fit.lambdarank`).

Features: those of :data:`fi_toolkit.policies.learned.fitted.FEATURES` (SnapKV's window attention, arXiv 2404.14469;
H2O's accumulator, arXiv 2306.14048; InfoKV's entropies, D^(l) and E^(l), arXiv 2606.26875; key norm, recency,
position) plus :data:`fi_toolkit.policies.learned.features.EXTRA`
(depth, KV head index, KeyDiff's score, the value side: ``||v||``, ``||W_o v||`` and accumulated
attention times ``||W_o v||``, and the scores of ExpectedAttention, arXiv 2510.00636, and TOVA,
arXiv 2401.06104). All come from :class:`Signals` at the compression point, so the policy never reads a token
after it (``entropy_next`` included: the tracker keeps every fed position's entropy, as for the fitted policy).

The model file is JSON (never pickle): format :data:`FORMAT`, the feature names, LightGBM's
``dump_model()`` trees (``model_dump``: evaluated by :func:`predict` in numpy after :func:`compile_trees` checks
every field, so deploying needs no LightGBM and a hostile file never reaches its C++ parser) and its
``model_to_string`` text (``model_string``, for LightGBM users; never parsed here), the model's architecture,
the signal settings, the training documents, the label settings and the library versions. Spelling:
``learned:path=FILE`` (``--select policy:learned@keep=0.25:path=model.json``); without ``path=``, the model
trained on the five bundled documents at p = 256 (:data:`DEFAULT_MODEL`, in a source checkout only; an
installed package has none and asks for ``path=``). Training needs LightGBM (``pip install -e '.[learned]'``);
deploying does not.

Budgets across heads: ``heads=uniform`` (the default) keeps the same ``k`` per KV head, ranked within each head;
``heads=global`` (``learned:path=FILE,heads=global``) shares each layer's budget over its KV heads by score,
as AdaKV (arXiv 2407.11550) does: the layer keeps the ``Hkv * (k - protected - window)`` highest-scoring
candidates over all its heads together, on top of every head's protected slots and window
(:func:`~fi_toolkit.policies.base.select_across_heads`), so each layer keeps in all exactly what the uniform
policy keeps and the budget means the same. It needs a model trained with one query group per layer
(``fi fit --learner lambdarank --group layer``, recorded as ``group`` in the file): a per-head model's scores
are only trained to rank within a head, and LambdaRank's gradients sum to zero within each query group, so
nothing in its training sets the offsets between heads (its gain on the KV head's index is 0), and a top-k
across heads would share budgets by those arbitrary offsets; such a file is refused. The keep map is uneven
(:class:`~fi_toolkit.eviction.KeepMap`): ``fi probe`` measures it by masking per head; compressed decoding holds it
padded in its dense cache and hides each head's pad slots from every query (its dead slots, as kvpress's AdaKV
masks), and later compressions share the layer's budget over the live entries only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from fi_toolkit.errors import FIError
from fi_toolkit.policies.base import as_signals
from fi_toolkit.policies.learned.features import LEARNED_FEATURES, learned_matrix
from fi_toolkit.policies.learned.fitted import (
    TOKEN_FEATURES,
    Fitted,
    check_listed_features,
    check_model_and_signals,
    read_policy_file,
)

if TYPE_CHECKING:
    import torch

    from fi_toolkit.signals.policy_view import Signals

FORMAT = "fi_toolkit.learned/1"
HEADS = ("uniform", "global")  # the policy's heads option: every head keeps k, or a layer's budget shared by score
GROUPS = ("head", "layer")  # a model file's query group (absent in files made before it was recorded: head)
# the model trained on the five bundled documents (analyses/learned.py), present in a source checkout only
DEFAULT_MODEL = Path(__file__).resolve().parents[3] / "analyses" / "results" / "learned" / "model.json"


ZERO = 1e-35  # LightGBM's kZeroThreshold: |x| <= ZERO is "zero" for a split whose missing type is Zero
MAX_NODES = 10_000_000  # more tree nodes than this: refused before anything is built


def _number(v, where: str, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise FIError(f"{where}: a tree's {what} is not a finite number")
    return float(v)


def compile_trees(dump, n_features: int, where: str) -> list[dict]:
    """LightGBM's ``dump_model()`` JSON -> flat arrays per tree (``feature, threshold, left, right,
    default_left, zero_missing`` per split, ``leaf`` values; a child ``c < 0`` is leaf ``~c``), every field
    checked: numerical ``<=`` splits only, feature indices in ``[0, n_features)``, finite numbers, leaf
    indices in range. The policy evaluates these arrays itself (:func:`predict`), so a damaged or hostile
    file can never reach LightGBM's C++ parser."""
    import numpy as np

    if not isinstance(dump, dict) or not isinstance(dump.get("tree_info"), list):
        raise FIError(f"{where}: 'model_dump' is not a LightGBM dump_model() record")
    if dump.get("num_class") != 1 or dump.get("num_tree_per_iteration") != 1 or dump.get("average_output"):
        raise FIError(f"{where}: 'model_dump' is not a single-output ranking model")
    top = dump.get("max_feature_idx")
    if isinstance(top, bool) or not isinstance(top, int) or top != n_features - 1:
        got = top + 1 if isinstance(top, int) and not isinstance(top, bool) else "an unknown number of"
        raise FIError(f"{where}: the model takes {got} features, the file lists {n_features}")
    trees, total = [], 0
    for info in dump["tree_info"]:
        root = info.get("tree_structure") if isinstance(info, dict) else None
        if not isinstance(root, dict):
            raise FIError(f"{where}: a tree has no structure")
        feature, threshold, left, right, default_left, zero, leaves = [], [], [], [], [], [], {}
        stack = [(root, None, None)]  # (node, parent split index, is left child)
        while stack:
            node, parent, is_left = stack.pop()
            total += 1
            if total > MAX_NODES or not isinstance(node, dict):
                raise FIError(f"{where}: a tree is malformed or too large")
            if "split_feature" in node:
                f = node["split_feature"]
                if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < n_features:
                    raise FIError(f"{where}: a split's feature index is out of range")
                if node.get("decision_type") != "<=" or node.get("missing_type") not in ("None", "Zero", "NaN"):
                    raise FIError(f"{where}: only numerical '<=' splits are supported")
                code = len(feature)
                feature.append(f)
                threshold.append(_number(node.get("threshold"), where, "threshold"))
                default_left.append(bool(node.get("default_left")))
                zero.append(node["missing_type"] == "Zero")
                left.append(0)
                right.append(0)
                stack.append((node.get("right_child"), code, False))
                stack.append((node.get("left_child"), code, True))
            else:
                k = node.get("leaf_index", 0)
                if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < MAX_NODES or k in leaves:
                    raise FIError(f"{where}: a leaf index is out of range or repeated")
                leaves[k] = _number(node.get("leaf_value"), where, "leaf value")
                code = ~k
            if parent is not None:
                (left if is_left else right)[parent] = code
        if sorted(leaves) != list(range(len(leaves))) or len(leaves) != len(feature) + 1:
            raise FIError(f"{where}: a tree's leaves are not numbered 0..{len(feature)}")
        trees.append(
            {
                "feature": np.array(feature, dtype=np.int64),
                "threshold": np.array(threshold, dtype=np.float64),
                "left": np.array(left, dtype=np.int64),
                "right": np.array(right, dtype=np.int64),
                "default_left": np.array(default_left, dtype=bool),
                "zero": np.array(zero, dtype=bool),
                "leaf": np.array([leaves[k] for k in range(len(leaves))], dtype=np.float64),
            }
        )
    return trees


def predict(trees: list[dict], x):
    """The sum of the trees' leaf values for rows ``x [n, F]`` float64 (finite) -> ``[n]`` float64:
    LightGBM's numerical decision, ``x <= threshold`` goes left, a "zero" value under missing type Zero goes
    the default way."""
    import numpy as np

    out = np.zeros(len(x), dtype=np.float64)
    rows = np.arange(len(x))
    for tree in trees:
        if len(tree["feature"]) == 0:
            out += tree["leaf"][0]
            continue
        node = np.zeros(len(x), dtype=np.int64)
        live = node >= 0
        while live.any():
            r, n = rows[live], node[live]
            v = x[r, tree["feature"][n]]
            go_left = v <= tree["threshold"][n]
            z = tree["zero"][n] & (np.abs(v) <= ZERO)
            go_left = np.where(z, tree["default_left"][n], go_left)
            node[live] = np.where(go_left, tree["left"][n], tree["right"][n])
            live = node >= 0
        out += tree["leaf"][~node]
    return out


def read_learned(path: str | Path) -> dict:
    """The learned-model JSON at ``path``, checked (format, features known, architecture and signal settings
    present, trees well formed with as many inputs as features); the compiled trees under ``trees``."""
    where = f"learned policy '{path}'"
    data = read_policy_file(path, where, "learned-model", FORMAT, "fi fit, learner lambdarank")
    names = data.get("features")
    check_listed_features(names, LEARNED_FEATURES, where)
    check_model_and_signals(data, where)
    group = data.setdefault("group", "head")
    if group not in GROUPS:
        raise FIError(f"{where}: 'group' must be head or layer, got {group!r}")
    data["trees"] = compile_trees(data.get("model_dump"), len(names), where)
    return data


@dataclass
class Learned(Fitted):
    """Keep the entries with the highest LightGBM score (module docstring); ``path``: the model JSON.
    ``window`` (0, the default) is the one the model was trained with; ``heads``: ``uniform`` (every KV head
    keeps the same count) or ``global`` (a layer's budget shared over its heads by score; a model trained with
    one query group per layer)."""

    heads: str = "uniform"

    name: ClassVar[str] = "learned"
    no_layer_weight: ClassVar[str] = "ranks by a learned within-head score, not a mass to share layer budgets by"

    def __post_init__(self):
        if not self.path:
            if not DEFAULT_MODEL.is_file():
                raise FIError("learned needs the model JSON: learned:path=FILE (made by fi fit, learner lambdarank)")
            self.path = str(DEFAULT_MODEL)
        self.fit = read_learned(self.path)
        trained_window = self.fit["signals"]["window"]
        self.window = self.window or trained_window
        super(Fitted, self).__post_init__()
        if self.window != trained_window:
            raise FIError(f"learned policy '{self.path}' was trained with window {trained_window}, not {self.window}")
        if self.heads not in HEADS:
            raise FIError(f"heads must be uniform or global, got '{self.heads}'")
        if self.heads == "global" and self.fit["group"] != "layer":
            raise FIError(
                f"learned policy '{self.path}' ranks within each KV head (trained with group head), so its scores "
                "are not comparable across heads: heads=global needs a model trained with group layer"
            )
        self.uneven_heads = self.heads == "global"
        names = self.fit["features"]
        self.needs_token_signals = any(n in TOKEN_FEATURES for n in names)
        self.tracks_accumulated = any(n in ("log_accumulated", "acc_wo_vnorm") for n in names)
        self._batched = None  # (signals, every layer's scores) while keep_map runs

    def linear_score(self, s: Signals, layer: int) -> torch.Tensor:
        """The model's score of every slot -> ``[Hkv, n_l]`` float64 (the trees evaluated in numpy); within
        :meth:`keep_map`, every layer's scores come from its one batched evaluation."""
        if self._batched is not None and self._batched[0] is s:
            return self._batched[1][layer]
        return self._predict(s, [layer])[0]

    def _predict(self, s: Signals, layers: list[int]) -> list[torch.Tensor]:
        """Scores ``[Hkv, n_l]`` of ``layers``, their feature rows stacked into one :func:`predict` call: the tree
        walk costs numpy calls per tree level, whatever the rows, so one call for all layers, not one per layer
        (2.6 s of the 2.8 s a keep map took at p = 512 went to 30 walks of 1,440 rows)."""
        import numpy as np
        import torch

        fit = self.fit
        shapes, flats, device = [], [], None
        for layer in layers:
            x = learned_matrix(s, layer, fit["features"], fit["signals"]["entropy_of"], float(fit["signals"]["tau"]))
            f, hkv, n = x.shape
            shapes.append((hkv, n))
            flats.append(x.permute(1, 2, 0).reshape(-1, f).cpu().numpy())
            device = x.device
        flat = np.concatenate(flats)
        if not np.isfinite(flat).all():
            raise FIError(f"learned policy '{self.path}': non-finite feature (NaN or inf)")
        scores = torch.from_numpy(predict(fit["trees"], flat)).to(device)
        return [part.reshape(shape) for part, shape in zip(scores.split([h * n for h, n in shapes]), shapes)]

    def keep_map(self, signals):
        """:meth:`Policy.keep_map <fi_toolkit.policies.base.Policy.keep_map>`; with ``heads=global`` each layer's
        budget (the uniform ``k`` per head, times ``Hkv``) is shared over its heads by the raw float64 scores
        (:func:`~fi_toolkit.policies.base.select_across_heads`): an uneven keep map. Every layer's scores are
        predicted in one batch first (:meth:`_predict`)."""
        s = as_signals(signals)
        self._check_architecture(s)
        self._batched = (s, self._predict(s, list(range(s.num_layers))))
        try:
            if self.heads != "global":
                return super().keep_map(s)
            return self.keep_map_across_heads(s)
        finally:
            self._batched = None

    def scores_for_heads(self, s: Signals, layer: int, across_heads: bool) -> torch.Tensor:
        """Across heads, the raw float64 scores (comparable across the heads of a layer); within a head, the ranks
        :meth:`scores` gives."""
        return self.linear_score(s, layer) if across_heads else self.scores(s, layer)
