"""``fi view``: one standalone HTML page that shows why a policy evicts what it evicts.

Every prefix token is shaded by its estimated Forward Influence on one future chunk (the Fisher
estimate, :func:`fi_toolkit.probe.estimator.fisher_fi`) or, switchable, by the trace's signals H, A,
D and S (:mod:`fi_toolkit.signals.trace`) or a policy's own score. The shade is the token's *rank* among
the prefix tokens (FI spans decades; a rank keeps the few largest from washing out the rest), on a
sequential scale that stays ordered under the common colour-vision deficiencies (ColorBrewer's YlGnBu:
lightness falls monotonically from pale yellow to navy; text turns white on the dark end), with a colour
bar that names the quantity, its unit and the values at its quartiles (all in one notation). A policy's
mark (a strip in its own colour under the token, one toggle per policy) appears only where that policy
evicts the token: from at least half of the model's layer x KV-head pairs (faint), or from all of them
(solid). Hovering a token shows its numbers and, per policy, its evicted share and the policy's score; hovering a policy
shows its summary. Newlines show as ``↵`` so that every token, whitespace included, has a box under the
pointer.

The page needs no network: CSS, script and data are inline (the data as one JSON block); the script
builds the token spans on load and answers hovers with one listener on their container, so a page of
8,192 tokens stays responsive (docs/guides/view.md). A page ``fi report`` copies beside its report links back
to the report's index page (:func:`with_report_link`); a page written alone has no such link.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fi_toolkit.eviction import KeepMap
from fi_toolkit.report.numbers import percent, same_notation, significant
from fi_toolkit.runs import results

GENERATOR = "fi view"  # <meta name="generator">: how fi report recognises a page (fi_toolkit.report.export)
# Sequential, colour-blind-safe shade (ColorBrewer YlGnBu without its palest class, so the low ranks, where most
# tokens are, still differ): rank 0 -> first, rank 1 -> last, interpolated in sRGB.
SHADE = ["#edf8b1", "#c7e9b4", "#7fcdbb", "#41b6c4", "#1d91c0", "#225ea8", "#253494", "#081d58"]
# One mark colour per policy (Okabe-Ito; pairwise distinct under deuteranopia, drawn on the white page below
# the shaded token, so they never sit on the shade).
MARKS = ["#000000", "#D55E00", "#56B4E9", "#009E73", "#CC79A7", "#E69F00", "#0072B2"]
MAJORITY = 0.5  # a policy's mark shows where it evicts a token from at least this share of (layer, KV head) pairs
TICKS = (0, 0.25, 0.5, 0.75, 1)  # the colour bar's ticks: the smallest value, the quartiles, the largest
REPORT_LINK = "fi-report"  # the id of the link back to the report a page is copied into (with_report_link)
SIGNALS = {  # page key -> (what it is, the trace's per-token score; fi_toolkit.probe.selections.token_scores)
    "H": ("top-k entropy of the distribution that produced the token (nats)", "entropy"),
    "A": ("window attention, mean over layers and KV heads", "attention"),
    "D": ("representation distance, mean over layers", "distance"),
    "S": ("InfoKV score S, mean over layers and KV heads (undefined in the window)", "infokv"),
}


def evicted_counts(keep_map: KeepMap, prefix_len: int) -> torch.Tensor:
    """How many (layer, KV head) pairs evicted each prefix position.

    ``keep_map.keep[l]``: ``[Hkv, k_l]`` kept positions (uneven maps pad rows, which ``visible`` handles).
    Returns ``[p]`` int64 in ``[0, L * Hkv]``; the evicted share is this over ``L * Hkv``."""
    visible = keep_map.visible(prefix_len)  # [L, Hkv, p]
    return (~visible).sum(dim=(0, 1))


def policy_scores(policy, signals) -> torch.Tensor | None:
    """A policy's own score of each prefix token (:meth:`~fi_toolkit.policies.base.Policy.scores`, higher =
    keep), mean over layers and KV heads -> ``[p]`` float32; None for a policy that ranks no scores (a kvpress
    press keeps what its press keeps)."""
    try:
        per_layer = [policy.scores(signals, layer).float().mean(dim=0) for layer in range(signals.num_layers)]
    except (NotImplementedError, AttributeError, TypeError):
        return None
    return torch.stack(per_layer).mean(dim=0).cpu()


def chunk_noise_floor(model, trace, ids: torch.Tensor, chunk) -> float:
    """The chunk's noise floor (docs/method.md, "Noise floor"): the largest ``|FI|`` of the two controls,
    which change nothing mathematically, in nats."""
    from fi_toolkit.probe.forward_influence import forward_influence

    return float(forward_influence(model, trace, ids, [], [chunk], controls=True).noise_floor()[0])


@dataclass
class ViewData:
    """What one page shows. ``tokens``: the ``p`` prefix tokens' text; ``values``: per key (``FI``,
    ``FI_se``, ``H``, ``A``, ``D``, ``S``) ``[p]`` floats (NaN where undefined); ``evicted``: per policy
    label ``[p]`` counts of (layer, KV head) pairs out of ``pairs``; ``future``: the chunk's text;
    ``scores``: per policy label its own score ``[p]`` (:func:`policy_scores`), where it has one;
    ``settings``: the estimate's and the trace's settings, the policies' ``budgets`` and the chunk's
    ``noise_floor`` (nats)."""

    document: str
    model: str
    prefix: int
    chunk: str
    tokens: list[str]
    values: dict[str, torch.Tensor]
    evicted: dict[str, torch.Tensor]
    pairs: int
    future: str = ""
    settings: dict = field(default_factory=dict)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)


def view_data(lm, doc, trace, policies, chunk, samples: int = 16, seed: int = 0) -> ViewData:
    """Estimate FI on ``chunk`` and run every policy's keep map on ``trace`` (the trace of ``doc[:p]``).

    Args:
        lm: a :class:`~fi_toolkit.model.loading.LoadedModel` (its tokenizer may be None: tokens then show
            as ids).
        doc: the :class:`~fi_toolkit.documents.Document`; ``doc.ids`` ``[N]`` must reach ``chunk.end``.
        trace: :func:`~fi_toolkit.signals.trace.trace_prefix` of ``doc.ids`` at ``p``.
        policies: :class:`~fi_toolkit.policies.base.Policy` objects whose window is the trace's.
        chunk: the future :class:`~fi_toolkit.probe.chunks.Chunk` FI is estimated on (``chunk.start >= p``).
        samples: label draws of the Fisher estimate.
        seed: the seed of the label draws.

    Returns:
        :class:`ViewData`: per-token values ``[p]``, evicted counts ``[p]`` per policy, the policies' own
        scores, the chunk's noise floor (one more forward over the chunk) and the settings."""
    from fi_toolkit.probe.estimator import fisher_fi
    from fi_toolkit.probe.selections import token_scores
    from fi_toolkit.signals.policy_view import Signals

    p = trace.prefix_len
    est = fisher_fi(lm.model, trace, doc.ids, [chunk], samples, seed)
    values = {"FI": est.fi[:, 0].float(), "FI_se": est.se[:, 0].float()}
    for key, (_, kind) in SIGNALS.items():
        values[key] = token_scores(trace, kind).float()
    signals = dataclasses.replace(Signals.from_trace(trace), tokens=doc.ids[:p], model=lm.model)
    evicted = {policy.label: evicted_counts(policy.keep_map(signals), p) for policy in policies}
    scores = {policy.label: policy_scores(policy, signals) for policy in policies}
    floor = chunk_noise_floor(lm.model, trace, doc.ids, chunk)

    def text(i: int) -> str:
        return lm.tokenizer.decode([int(i)]) if lm.tokenizer is not None else f"[{int(i)}]"

    return ViewData(
        document=doc.name,
        model=lm.name,
        prefix=p,
        chunk=chunk.label,
        tokens=[text(i) for i in doc.ids[:p]],
        values=values,
        evicted=evicted,
        pairs=trace.num_layers * trace.num_kv_heads,
        future="".join(text(i) for i in doc.ids[chunk.start : chunk.end]),
        settings={
            "samples": samples,
            "seed": seed,
            "estimate_seconds": round(est.seconds, 2),
            "budgets": list(dict.fromkeys(policy.budget.label for policy in policies)),
            "noise_floor": floor,
            **{k: v for k, v in dataclasses.asdict(trace.config).items() if isinstance(v, (int, float, str))},
        },
        scores={k: v for k, v in scores.items() if v is not None},
    )


def _short(v: float) -> float | None:
    """4 significant digits for the page (the numbers a person reads); NaN -> null."""
    return None if not math.isfinite(v) else float(f"{v:.4g}")


def policy_summary(data: ViewData) -> list[dict]:
    """Per policy: its evicted share of the (layer, head, token) entries, and the share of the prefix's
    summed estimated FI on the evicted entries (each token's FI weighted by its evicted share)."""
    fi = torch.nan_to_num(data.values["FI"].double(), nan=0.0).clamp_min(0)
    rows = []
    for label, counts in data.evicted.items():
        share = counts.double() / data.pairs
        rows.append(
            {
                "policy": label,
                "evicted": float(share.mean()),
                "fi_evicted": float((share * fi).sum() / fi.sum()) if fi.sum() > 0 else float("nan"),
            }
        )
    return rows


def policy_entries(data: ViewData) -> list[dict]:
    """Per policy: its label, mark colour, budget (the label's part after ``@``), whether the page holds its
    score, and its summary (:func:`policy_summary`)."""
    summary = {r["policy"]: r for r in policy_summary(data)}
    return [
        {
            "label": label,
            "color": MARKS[i % len(MARKS)],
            "budget": label.rpartition("@")[2] if "@" in label else "",
            "score": label in data.scores,
            "evicted": _short(summary[label]["evicted"]),
            "fi_evicted": _short(summary[label]["fi_evicted"]),
        }
        for i, label in enumerate(data.evicted)
    ]


def median_se(data: ViewData) -> float:
    """The median standard error of the FI estimate over the prefix (nats; NaN without one)."""
    se = data.values.get("FI_se")
    if se is None:
        return float("nan")
    se = se[torch.isfinite(se)]
    return float(se.median()) if se.numel() else float("nan")


def tick_labels(values: list[float | None]) -> list[str]:
    """The colour bar's tick labels of one shading (``values``: the page's, None where undefined): the values at
    :data:`TICKS` of the sorted defined ones, picked as the page's script ranks them, in one notation
    (:func:`~fi_toolkit.report.numbers.same_notation`: never ``4.28e-7`` beside ``0.01083``)."""
    ranked = sorted(v for v in values if v is not None)
    if not ranked:
        return []
    return same_notation([ranked[math.floor(q * (len(ranked) - 1) + 0.5)] for q in TICKS])


def page_json(data: ViewData) -> dict:
    values = {k: [_short(float(x)) for x in v] for k, v in data.values.items()}
    scores = {k: [_short(float(x)) for x in v] for k, v in data.scores.items()}
    return {
        "document": data.document,
        "model": data.model,
        "prefix": data.prefix,
        "chunk": data.chunk,
        "tokens": data.tokens,
        "pairs": data.pairs,
        "values": values,
        "scores": scores,
        "ticks": {
            **{k: tick_labels(v) for k, v in values.items()},
            **{f"score:{k}": tick_labels(v) for k, v in scores.items()},
        },
        "evicted": {k: [int(x) for x in v] for k, v in data.evicted.items()},
        "policies": policy_entries(data),
        "shade": SHADE,
        "majority": MAJORITY,
        "tick_at": list(TICKS),
        "summary": [
            {k: (_short(v) if isinstance(v, float) else v) for k, v in r.items()} for r in policy_summary(data)
        ],
        "settings": data.settings,
    }


CSS = """body{font-family:system-ui,sans-serif;margin:0;color:#222}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.6em 1em;z-index:2}
h1{font-size:1.15em;margin:0 0 .3em}.cap{color:#555;font-size:13px;margin:.2em 0}
fieldset{display:inline-block;vertical-align:top;border:1px solid #ddd;margin:.2em .6em .2em 0;padding:.2em .6em;
font-size:13px}legend{font-size:12px;color:#555}label{margin-right:.7em;white-space:nowrap}
.swatch{display:inline-block;width:14px;height:4px;vertical-align:middle;margin-right:3px}
#cbar{display:inline-block;vertical-align:top;font-size:12px;margin-left:.4em}
#ramp{width:260px;height:12px;border:1px solid #999}#ticks{position:relative;width:262px;height:1.3em}
#ticks span{position:absolute;transform:translateX(-50%);white-space:nowrap;font-variant-numeric:tabular-nums}
#cbar-label{font-weight:600;max-width:420px}
#info{font-size:13px;min-height:2.6em;margin-top:.3em;font-variant-numeric:tabular-nums}
main{padding:1em;max-width:80em}
#tokens{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px;line-height:2.3}
#tokens span{border-radius:2px;cursor:default}#tokens span.hl{outline:2px solid #D55E00}
#tokens .nl{color:#999}
.future{color:#777;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px}td.num{text-align:right}
caption{text-align:left;font-size:13px;color:#333;padding:.2em 0}button.policy{font:inherit;border:0;
background:none;padding:0;cursor:pointer;text-decoration:underline dotted}"""

SCRIPT = r"""(function(){
const D=JSON.parse(document.getElementById('fi-data').textContent);
const box=document.getElementById('tokens'), info=document.getElementById('info'), hint=info.textContent;
const n=D.tokens.length, spans=new Array(n), frag=document.createDocumentFragment();
function shown(t){return t.replace(/\r?\n/g,'\u21b5\n');}
for(let i=0;i<n;i++){const s=document.createElement('span');s.textContent=shown(D.tokens[i]);s.dataset.i=i;
  if(/\n/.test(D.tokens[i])) s.classList.add('nl');spans[i]=s;frag.appendChild(s);}
box.appendChild(frag);
const series=Object.assign({},D.values);for(const k of Object.keys(D.scores)) series['score:'+k]=D.scores[k];
function ranks(v){const idx=[];for(let i=0;i<n;i++) if(v[i]!==null) idx.push(i);
  idx.sort((a,b)=>v[a]-v[b]);const r=new Float32Array(n).fill(NaN);const m=Math.max(1,idx.length-1);
  idx.forEach((i,k)=>{r[i]=k/m});return {r:r};}
const rank={};for(const k of Object.keys(series)) rank[k]=ranks(series[k]);
const stops=D.shade.map(h=>[1,3,5].map(j=>parseInt(h.slice(j,j+2),16)));
function color(x){const t=x*(stops.length-1), j=Math.min(stops.length-2,Math.floor(t)), f=t-j;
  return stops[j].map((c,k)=>Math.round(c+(stops[j+1][k]-c)*f));}
function dark(c){const l=c.map(v=>{v/=255;return v<=0.04045?v/12.92:Math.pow((v+0.055)/1.055,2.4);});
  return 0.2126*l[0]+0.7152*l[1]+0.0722*l[2]<0.18;}
function fmt(v){return v===null||v===undefined||Number.isNaN(v)?'\u2013':
  (Math.abs(v)>=1e4||(v!==0&&Math.abs(v)<1e-3)?v.toExponential(2).replace(/e([+-])(\d)$/,(m,s,d)=>'e'+s+'0'+d)
  :String(Number(v.toPrecision(4))));}
const labels=D.labels;
let shade=null;
function paint(){const r=rank[shade].r;
  for(let i=0;i<n;i++){const x=r[i], s=spans[i];
    if(Number.isNaN(x)){s.style.backgroundColor='';s.style.color='';continue;}
    const c=color(x);s.style.backgroundColor='rgb('+c.join(',')+')';s.style.color=dark(c)?'#fff':'';}
  box.dataset.shade=shade;
  document.getElementById('cbar-label').textContent=labels[shade];
  const ticks=document.getElementById('ticks');ticks.textContent='';
  (D.ticks[shade]||[]).forEach((text,j)=>{const t=document.createElement('span');
    t.style.left=(1+260*D.tick_at[j])+'px';t.textContent=text;ticks.appendChild(t);});}
const toggles=Array.from(document.querySelectorAll('input[name=evict]'));
function mark(){const on=D.policies.filter((p,j)=>toggles[j].checked);
  for(let i=0;i<n;i++){const strips=[];let k=0;
    for(const p of on){const f=D.evicted[p.label][i]/D.pairs;
      if(f>=D.majority){k+=3;strips.push('0 '+k+'px 0 '+(f===1?p.color:p.color+'66'));}}
    spans[i].style.boxShadow=strips.join(',');}
  box.dataset.policies=on.map(p=>p.label).join('|');}
function show(i){const v=D.values;
  let t='#'+i+' '+JSON.stringify(D.tokens[i])+' \u00b7 FI '+fmt(v.FI[i])+(v.FI_se[i]?' \u00b1 '+fmt(v.FI_se[i]):'')
  +' nats (rank '+(Number.isNaN(rank.FI.r[i])?'\u2013':Math.round(100*rank.FI.r[i])+' %')+')';
  for(const k of ['H','A','D','S']) t+=' \u00b7 '+k+' '+fmt(v[k][i]);
  const ev=D.policies.map(p=>p.label+': evicted from '+Math.round(100*D.evicted[p.label][i]/D.pairs)+' %'
    +(p.score?', score '+fmt(D.scores[p.label][i]):''));
  if(ev.length) t+=' \u00b7 '+ev.join('; ');
  info.textContent=t;}
let last=null;
function clear(){if(last!==null) spans[last].classList.remove('hl');last=null;info.textContent=hint;}
box.addEventListener('mouseover',ev=>{const i=ev.target.dataset.i;if(i===undefined){clear();return;}
  if(last!==null) spans[last].classList.remove('hl');last=+i;spans[last].classList.add('hl');show(last);});
box.addEventListener('mouseleave',clear);
document.querySelectorAll('input[name=shade]').forEach(el=>el.addEventListener('change',()=>{shade=el.value;paint();}));
document.querySelectorAll('input[name=evict]').forEach(el=>el.addEventListener('change',mark));
document.querySelectorAll('button.policy').forEach(el=>el.addEventListener('click',()=>{
  const r=document.querySelector('input[name=shade][value="'+CSS.escape(el.dataset.shade)+'"]');
  if(r){r.checked=true;shade=r.value;paint();}}));
shade=document.querySelector('input[name=shade]:checked').value;
paint();mark();window.fiReadyMs=performance.now();document.body.dataset.ready='1';
})();"""


def _policy_title(entry: dict) -> str:
    """A policy's summary as hover text."""
    fi = entry["fi_evicted"]
    return (
        f"{entry['label']}: evicts {percent(entry['evicted'])} of the (layer, KV head, token) entries, carrying "
        + ("n/a" if fi is None else percent(fi))
        + " of the summed FI estimate (lower is better)"
        + ("; shade by its score: click" if entry["score"] else "; it ranks no scores of its own")
    )


def _labels(data: ViewData) -> dict[str, str]:
    """What the colour bar says for each shading: the quantity, its unit, and which end is which."""
    labels = {
        "FI": f"estimated FI on {data.chunk} (nats): lower = the chunk needs the token less (safer to evict)",
        **{k: f"{k}: {what}" for k, (what, _) in SIGNALS.items()},
    }
    for label in data.scores:
        labels[f"score:{label}"] = f"{label}'s own score, mean over layers and KV heads (higher = the policy keeps it)"
    return labels


def _summary(data: ViewData, entries: list[dict]) -> str:
    """The table at the top: each policy's evicted share and the FI it evicts, with the budget and noise floor."""
    e = html.escape
    s = data.settings
    floor, se = s.get("noise_floor"), median_se(data)
    budgets = ", ".join(s.get("budgets", [])) or "–"
    caption = (
        f"Budget {budgets} (entries kept per layer and KV head, a share of the prefix). Noise floor of FI on "
        f"{data.chunk}: {'n/a' if floor is None else significant(floor, 1)} nats (the controls, float rounding); "
        f"median standard error of the estimate: {significant(se, 2)} nats. Lower FI share evicted is better."
    )
    rows = "".join(
        f"<tr><td><span class='swatch' style='background:{r['color']}'></span>"
        f"<button class='policy' data-shade='score:{e(r['label'])}' title='{e(_policy_title(r))}'>{e(r['label'])}"
        f"</button></td><td>{e(r['budget'])}</td><td class='num'>{percent(r['evicted'])}</td><td class='num'>"
        f"{'n/a' if r['fi_evicted'] is None else percent(r['fi_evicted'])}</td></tr>"
        for r in entries
    )
    return (
        f"<table id='summary'><caption>{e(caption)}</caption><thead><tr><th>policy</th><th>budget</th><th>evicted "
        "entries</th><th>share of the summed FI estimate on evicted entries (lower is better)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def render(data: ViewData) -> str:
    """The page (one string of HTML, everything inline)."""
    e = html.escape
    shown = {**page_json(data), "labels": _labels(data)}
    payload = json.dumps(shown, allow_nan=False, ensure_ascii=False).replace("<", "\\u003c")
    entries = policy_entries(data)
    shade = [("FI", f"FI (estimate on {data.chunk})")] + [(k, k) for k in SIGNALS]
    shade += [(f"score:{label}", f"{label.partition('@')[0]} score") for label in data.scores]
    shade_inputs = "".join(
        f"<label><input type='radio' name='shade' value='{e(k)}'{' checked' if k == 'FI' else ''}> {e(text)}</label>"
        for k, text in shade
    )
    evict_inputs = "".join(
        f"<label title='{e(_policy_title(r))}'><input type='checkbox' name='evict' value='{e(r['label'])}'"
        f"{' checked' if i == 0 else ''}><span class='swatch' style='background:{r['color']}'></span>"
        f"{e(r['label'])}</label>"
        for i, r in enumerate(entries)
    )
    s = data.settings
    cap = (
        f"model {data.model} | prefix p = {data.prefix:,} tokens | FI: Fisher estimate on chunk {data.chunk} "
        f"({s.get('samples')} label draws, seed {s.get('seed')}) | window {s.get('window')} | shade: the token's "
        f"rank among the prefix tokens | a policy's strip under a token: it evicts the token from at least half "
        f"(faint) or all (solid) of the {data.pairs} layer x KV-head pairs"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='generator' content='{GENERATOR}'><meta name='fi-view-document' content='{e(data.document)}'>"
        f"<title>fi view: {e(data.document)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>Why these tokens? {e(data.document)}</h1><p class='cap'>{e(cap)}</p>"
        f"<fieldset id='shade'><legend>shade by</legend>{shade_inputs}</fieldset>"
        f"<div id='cbar'><div id='cbar-label'></div><div id='ramp' style='background:linear-gradient(90deg,"
        f"{','.join(SHADE)})'></div><div id='ticks'></div></div><br>"
        f"<fieldset id='evict'><legend>evictions of (toggle each)</legend>{evict_inputs}</fieldset>"
        "<div id='info'>hover a token to read its numbers</div></header><main>"
        f"{_summary(data, entries)}"
        f"<h2 style='font-size:1em'>prefix [0, {data.prefix:,})</h2><div id='tokens'></div>"
        f"<h2 style='font-size:1em'>chunk {e(data.chunk)} (FI is measured on it)</h2><div "
        f"class='future'>{e(data.future)}</div></main>"
        f"<script type='application/json' id='fi-data'>{payload}</script><script>{SCRIPT}</script></body></html>"
    )


def with_report_link(page: str, href: str) -> str:
    """A page ``fi view`` wrote, with a link back to the report it is copied into, first in its header
    (``href``: the report's index page, relative to the page; a link the page already had is replaced). A page
    written alone has none: nothing to lead back to."""
    import re

    page = re.sub(rf"<nav id='{REPORT_LINK}'[^>]*>.*?</nav>", "", page, count=1, flags=re.S)
    link = (
        f"<nav id='{REPORT_LINK}' style='font-size:13px;margin-bottom:.3em'><a href='{html.escape(href)}'>"
        "\u2190 back to the report</a></nav>"
    )
    return page.replace("<header>", f"<header>{link}", 1)


def write_view(path: Path, data: ViewData) -> Path:
    """Write the page atomically (a failed write leaves no half page)."""
    results.atomic_write_text(Path(path), render(data))
    return Path(path)


def read_view_meta(path: Path) -> dict | None:
    """``{'document': ...}`` of a page ``fi view`` wrote, or None for any other file (read from its head)."""
    import re

    try:
        head = Path(path).read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        return None
    if f"<meta name='generator' content='{GENERATOR}'>" not in head:
        return None
    m = re.search(r"<meta name='fi-view-document' content='([^']*)'>", head)
    return {"document": html.unescape(m.group(1))} if m else None
