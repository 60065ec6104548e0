"""``fi view``: one standalone HTML page that shows why a policy evicts what it evicts.

Every prefix token is shaded by its estimated Forward Influence on one future chunk (the Fisher
estimate, :func:`fi_toolkit.probe.estimator.fisher_fi`) or, switchable, by the trace's signals H, A,
D and S (:mod:`fi_toolkit.signals.trace`); for each policy, a mark under each token shows the share of
layers x KV heads whose keep map (``policy.keep_map(trace)``) evicted it; hovering a token shows its
numbers. The shade is the token's *rank* among the prefix tokens (FI spans decades; a rank keeps the
few largest from washing out the rest). The page needs no network: CSS, script and data are inline
(the data as one JSON block); the script builds the token spans on load and answers hovers with one
listener on their container, so a page of 8,192 tokens stays responsive (docs/guides/view.md).
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
from fi_toolkit.runs import results

GENERATOR = "fi view"  # <meta name="generator">: how fi report recognises a page (fi_toolkit.report.export)
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


@dataclass
class ViewData:
    """What one page shows. ``tokens``: the ``p`` prefix tokens' text; ``values``: per key (``FI``,
    ``FI_se``, ``H``, ``A``, ``D``, ``S``) ``[p]`` floats (NaN where undefined); ``evicted``: per policy
    label ``[p]`` counts of (layer, KV head) pairs out of ``pairs``; ``future``: the chunk's text."""

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


def view_data(lm, doc, trace, policies, chunk, samples: int = 16, seed: int = 0) -> ViewData:
    """Estimate FI on ``chunk`` and run every policy's keep map on ``trace`` (the trace of ``doc[:p]``).

    ``lm``: a :class:`~fi_toolkit.model.loading.LoadedModel` (its tokenizer may be None: tokens then
    show as ids); ``policies``: :class:`~fi_toolkit.policies.base.Policy` objects, window = the trace's."""
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
            **{k: v for k, v in dataclasses.asdict(trace.config).items() if isinstance(v, (int, float, str))},
        },
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


def page_json(data: ViewData) -> dict:
    return {
        "document": data.document,
        "model": data.model,
        "prefix": data.prefix,
        "chunk": data.chunk,
        "tokens": data.tokens,
        "pairs": data.pairs,
        "values": {k: [_short(float(x)) for x in v] for k, v in data.values.items()},
        "evicted": {k: [int(x) for x in v] for k, v in data.evicted.items()},
        "summary": [
            {k: (_short(v) if isinstance(v, float) else v) for k, v in r.items()} for r in policy_summary(data)
        ],
        "settings": data.settings,
    }


CSS = """body{font-family:system-ui,sans-serif;margin:0;color:#222}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:.6em 1em;z-index:2}
h1{font-size:1.15em;margin:0 0 .3em}.cap{color:#555;font-size:13px;margin:.2em 0}
fieldset{display:inline-block;border:1px solid #ddd;margin:.2em .6em .2em 0;padding:.2em .6em;font-size:13px}
legend{font-size:12px;color:#555}label{margin-right:.7em;white-space:nowrap}
#info{font-size:13px;min-height:1.4em;margin-top:.3em;font-variant-numeric:tabular-nums}
#ramp{display:inline-block;width:120px;height:10px;vertical-align:middle;border:1px solid #ccc;
background:linear-gradient(90deg,rgba(230,85,13,0),rgba(230,85,13,.9))}
main{padding:1em;max-width:80em}#tokens{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px;line-height:1.9}
#tokens span{border-radius:2px;cursor:default}#tokens span.ev{color:#888;text-decoration:line-through}
#tokens span.hl{outline:2px solid #1f77b4}
.future{color:#888;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:13px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}td.num{text-align:right}"""

SCRIPT = r"""(function(){
const D=JSON.parse(document.getElementById('fi-data').textContent);
const box=document.getElementById('tokens'), info=document.getElementById('info');
const n=D.tokens.length, spans=new Array(n), frag=document.createDocumentFragment();
for(let i=0;i<n;i++){const s=document.createElement('span');s.textContent=D.tokens[i];s.dataset.i=i;spans[i]=s;
  frag.appendChild(s);}
box.appendChild(frag);
function ranks(v){const idx=[];for(let i=0;i<n;i++) if(v[i]!==null) idx.push(i);
  idx.sort((a,b)=>v[a]-v[b]);const r=new Float32Array(n).fill(NaN);const m=Math.max(1,idx.length-1);
  idx.forEach((i,k)=>{r[i]=k/m});return r;}
const rank={};for(const k of Object.keys(D.values)) rank[k]=ranks(D.values[k]);
let shade=null, policy=null;
function paint(){const r=rank[shade];
  for(let i=0;i<n;i++){const x=r[i];
    spans[i].style.backgroundColor=Number.isNaN(x)?'':'rgba(230,85,13,'+(0.9*x).toFixed(3)+')';}
  box.dataset.shade=shade;}
function mark(){const e=policy===null?null:D.evicted[policy];
  for(let i=0;i<n;i++){const s=spans[i];if(e===null||e[i]===0){s.style.boxShadow='';s.classList.remove('ev');continue;}
    const f=e[i]/D.pairs;s.style.boxShadow='inset 0 -3px 0 rgba(214,39,40,'+(0.25+0.75*f).toFixed(3)+')';
    s.classList.toggle('ev',e[i]===D.pairs);}
  box.dataset.policy=policy===null?'':policy;}
function fmt(v){return v===null?'–':
  (Math.abs(v)>=1e4||(v!==0&&Math.abs(v)<1e-3)?v.toExponential(2):String(Number(v.toPrecision(4))));}
function show(i){const v=D.values;
  let t='#'+i+' '+JSON.stringify(D.tokens[i])+' · FI '+fmt(v.FI[i])+(v.FI_se[i]?' ± '+fmt(v.FI_se[i]):'')
  +' (rank '+(Number.isNaN(rank.FI[i])?'–':Math.round(100*rank.FI[i])+' %')+')';
  for(const k of ['H','A','D','S']) t+=' · '+k+' '+fmt(v[k][i]);
  const ev=Object.keys(D.evicted).map(p=>p+' '+Math.round(100*D.evicted[p][i]/D.pairs)+' %');
  if(ev.length) t+=' · evicted by: '+ev.join(', ');
  info.textContent=t;}
let last=null;
box.addEventListener('mouseover',ev=>{const i=ev.target.dataset.i;if(i===undefined) return;
  if(last!==null) spans[last].classList.remove('hl');last=+i;spans[last].classList.add('hl');show(last);});
document.querySelectorAll('input[name=shade]').forEach(el=>el.addEventListener('change',()=>{shade=el.value;paint();}));
document.querySelectorAll('input[name=evict]').forEach(el=>el.addEventListener('change',()=>{policy=el.value===''?null:el.value;mark();}));
shade=document.querySelector('input[name=shade]:checked').value;
const p0=document.querySelector('input[name=evict]:checked');policy=p0&&p0.value!==''?p0.value:null;
paint();mark();window.fiReadyMs=performance.now();document.body.dataset.ready='1';
})();"""


def render(data: ViewData) -> str:
    """The page (one string of HTML, everything inline)."""
    e = html.escape
    payload = json.dumps(page_json(data), allow_nan=False, ensure_ascii=False).replace("<", "\\u003c")
    shade = [("FI", f"FI (Fisher estimate on {data.chunk})")] + [(k, f"{k}") for k in SIGNALS]
    shade_inputs = "".join(
        f"<label title='{e(SIGNALS[k][0]) if k in SIGNALS else 'estimated Forward Influence (nats)'}'>"
        f"<input type='radio' name='shade' value='{k}'{' checked' if k == 'FI' else ''}> {e(text)}</label>"
        for k, text in shade
    )
    labels = list(data.evicted)
    evict_inputs = "<label><input type='radio' name='evict' value=''> none</label>" + "".join(
        f"<label><input type='radio' name='evict' value='{e(label)}'{' checked' if i == 0 else ''}> {e(label)}</label>"
        for i, label in enumerate(labels)
    )
    summary = "".join(
        f"<tr><td>{e(r['policy'])}</td><td class='num'>{r['evicted']:.1%}</td><td class='num'>"
        f"{'' if r['fi_evicted'] != r['fi_evicted'] else format(r['fi_evicted'], '.1%')}</td></tr>"
        for r in policy_summary(data)
    )
    s = data.settings
    cap = (
        f"model {data.model} | prefix p = {data.prefix:,} tokens | FI: Fisher estimate on chunk {data.chunk} "
        f"({s.get('samples')} label draws, seed {s.get('seed')}) | window {s.get('window')} | "
        f"shade: the token's rank among the prefix tokens | red mark: share of the {data.pairs} layer x KV-head "
        "pairs that evicted the token (struck through: all of them)"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='generator' content='{GENERATOR}'><meta name='fi-view-document' content='{e(data.document)}'>"
        f"<title>fi view: {e(data.document)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>Why these tokens? {e(data.document)}</h1><p class='cap'>{e(cap)}</p>"
        f"<fieldset id='shade'><legend>shade by</legend>{shade_inputs} <span id='ramp' title='low to high "
        f"rank'></span></fieldset>"
        f"<fieldset id='evict'><legend>evicted by</legend>{evict_inputs}</fieldset>"
        "<div id='info'>hover a token to read its numbers</div></header><main>"
        "<table id='summary'><thead><tr><th>policy</th><th>evicted entries</th><th>share of the summed FI estimate "
        f"on evicted entries</th></tr></thead><tbody>{summary}</tbody></table>"
        f"<h2 style='font-size:1em'>prefix [0, {data.prefix:,})</h2><div id='tokens'></div>"
        f"<h2 style='font-size:1em'>chunk {e(data.chunk)} (FI is measured on it)</h2><div "
        f"class='future'>{e(data.future)}</div>"
        f"</main><script type='application/json' id='fi-data'>{payload}</script><script>{SCRIPT}</script></body></html>"
    )


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
