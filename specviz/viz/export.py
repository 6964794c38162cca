"""A recorded run (a trace file's content) as views: its race series and headline, and one self-contained HTML
page with the token view, the headline, the race chart, step-through with narration and microscope, a replay at
0.25×–4× racing the AR baseline, and a presentation mode. The page inlines plotly and every script, so it works
offline from disk."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping

from specviz.viz import charts
from specviz.viz.render import GENERATE, Headline, TokenSpan, headline_html, legend_html, spans_html, token_css
from specviz.viz.teach import microscope_css, microscope_html, narrate
from specviz.viz.trace import cumulative

SPEEDS = (0.25, 0.5, 1, 2, 4)


def race_series(trace: Mapping) -> list[charts.Series]:
    """The run and, if recorded, its AR baseline and transformers' generate as race-chart series."""
    series = [charts.Series(run_label(trace["config"]), *cumulative(trace["steps"]))]
    if trace.get("baseline"):
        series.append(charts.Series("autoregressive", *cumulative(trace["baseline"]["steps"]), baseline=True))
    return series + generate_series(trace.get("transformers"))


def generate_series(figure: Mapping | None) -> list[charts.Series]:
    """transformers' generate on the race chart, when it was timed: only its total is known, so a straight line to it."""
    if not figure or not figure.get("tokens_per_s"):
        return []
    return [charts.Series(GENERATE, [0.0, figure["wall_s"]], [0, figure["new_tokens"]], baseline=True,
                          note="total only, drawn at its mean rate", peer=True)]


def run_label(config: Mapping) -> str:
    if config["method"] == "ar":
        return "autoregressive"
    drafts = " → ".join(config["chain"]) if config["chain"] else ", ".join(config["select"]) or config["draft"] or "default draft"
    size = f"{config['tree_kind']} tree of {config['tree_nodes']}" if config.get("tree_nodes") else f"γ={config['gamma']}"
    return f"sd {drafts} {size} ({config['gamma_policy']}, {config['accept']})"


def trace_headline(trace: Mapping) -> Headline:
    """The headline of a recorded run: as the app showed it, an AR run being its own baseline."""
    m, base = trace["metrics"], (trace.get("baseline") or {}).get("metrics")
    if trace["config"]["method"] == "ar":
        return Headline(1.0, m["tokens_per_s"], m["tokens_per_s"], 1.0, None, m["new_tokens"], m["wall_s"],
                        "this run is the autoregressive baseline", trace.get("transformers"))
    speedup = m["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
    return Headline(speedup, m["tokens_per_s"], base["tokens_per_s"] if base else None, m["mean_accept_len"],
                    m["accept_rate"] if m["drafted"] else None, m["new_tokens"], m["wall_s"],
                    "AR baseline of the same prompt and settings" if base else "no AR baseline recorded", trace.get("transformers"))


def plain_ms_per_token(trace: Mapping) -> float | None:
    """What a plain decoding step costs per token: the AR baseline's, else this run's own plain steps'."""
    steps = (trace.get("baseline") or {}).get("steps") or [s for s in trace["steps"] if not s["draft_ids"]]
    tokens = sum(len(s["emitted_ids"]) for s in steps)
    return sum(s["total_ms"] for s in steps) / tokens if tokens else None


def step_views(trace: Mapping) -> list[tuple[str, str]]:
    """(narration, microscope) HTML of every step."""
    pieces, plain = trace["pieces"], plain_ms_per_token(trace)
    return [(html.escape(narrate(s, pieces, plain)), microscope_html(s, pieces)) for s in trace["steps"]]


PAGE_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #1b1f24; }
.sv-cards { display: flex; gap: 10px; flex-wrap: wrap; margin: 10px 0; }
.sv-card { border: 1px solid #d0d7de; border-radius: 8px; padding: 8px 12px; min-width: 120px; }
.sv-card-value { font-size: 24px; font-weight: 700; } .sv-card-label, .sv-card-hint { font-size: 12px; color: #57606a; }
.sv-legend-item { margin-right: 12px; font-size: 12px; } .sv-cue { color: #57606a; }
.controls { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 12px 0; position: sticky; top: 0;
  background: #fff; padding: 6px 0; }
.controls button, .controls select { font-size: 14px; padding: 4px 10px; }
#tokens { border: 1px solid #d0d7de; border-radius: 8px; padding: 10px; }
.sv-tok.sv-cur { outline: 2px solid #cf222e; outline-offset: 1px; }
.sv-tok.sv-hidden { display: none; }
.race-bars div { margin: 3px 0; font-size: 13px; } .race-bars span.bar { display: inline-block; height: 10px; background: #4c6ef5; }
.race-bars span.bar.ar { background: #868e96; }
.views { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.meta { font-size: 12px; color: #57606a; }
body.present { max-width: none; margin: 12px 32px; } body.present .sv-tokens { font-size: 28px; }
body.present .sv-narration { font-size: 24px; } body.present .sv-mic { font-size: 20px; } body.present .sv-card-value { font-size: 36px; }
"""

PAGE_JS = """
const steps = DATA.steps, n = steps.length, ar = DATA.ar;
let cur = n, timer = null;
const $ = (id) => document.getElementById(id);
function show(k) {
  cur = Math.max(1, Math.min(n, k));
  $('narration').innerHTML = $('n-' + cur).innerHTML;
  $('microscope').innerHTML = $('m-' + cur).innerHTML;
  document.querySelectorAll('.sv-tok.sv-cur').forEach(e => e.classList.remove('sv-cur'));
  document.querySelectorAll('#tokens .sv-tok[data-step="' + cur + '"]').forEach(e => e.classList.add('sv-cur'));
  $('step').value = cur; $('step-label').textContent = 'step ' + cur + ' / ' + n;
}
function tokensAt(times, tokens, t) { let k = 0; while (k + 1 < times.length && times[k + 1] <= t) k++; return tokens[k]; }
function replay() {
  if (timer) { cancelAnimationFrame(timer); timer = null; }
  const speed = parseFloat($('speed').value), start = performance.now();
  const end = Math.max(steps[n - 1].t, ar ? ar.times[ar.times.length - 1] : 0);
  const spans = document.querySelectorAll('#tokens .sv-tok');
  function frame(now) {
    const t = (now - start) / 1000 * speed;
    let k = 0; while (k < n && steps[k].t <= t) k++;
    spans.forEach(e => e.classList.toggle('sv-hidden', parseInt(e.dataset.step) > k));
    if (k > 0) show(k);
    const sd = tokensAt(DATA.sd.times, DATA.sd.tokens, t);
    $('sd-bar').style.width = (300 * sd / DATA.total) + 'px'; $('sd-count').textContent = sd + ' tokens';
    if (ar) {
      const a = tokensAt(ar.times, ar.tokens, t);
      $('ar-bar').style.width = (300 * a / DATA.total) + 'px'; $('ar-count').textContent = a + ' tokens';
    }
    $('clock').textContent = t.toFixed(2) + ' s';
    timer = t < end ? requestAnimationFrame(frame) : null;
  }
  timer = requestAnimationFrame(frame);
}
document.addEventListener('keydown', (e) => {
  if (['INPUT', 'SELECT', 'TEXTAREA'].includes(e.target.tagName) && e.target.id !== 'step') return;
  if (e.key === 'ArrowLeft') { show(cur - 1); e.preventDefault(); }
  if (e.key === 'ArrowRight') { show(cur + 1); e.preventDefault(); }
});
$('prev').onclick = () => show(cur - 1); $('next').onclick = () => show(cur + 1);
$('step').oninput = (e) => show(parseInt(e.target.value));
$('replay').onclick = replay;
$('present').onclick = () => document.body.classList.toggle('present');
if (window.Plotly) Plotly.newPlot('race', FIGURE.data, FIGURE.layout, {displayModeBar: false, responsive: true});
show(n);
"""


def _spans_html(trace: Mapping) -> str:
    return spans_html(TokenSpan(*s) for s in trace["spans"])


def trace_page(trace: Mapping) -> str:
    """The self-contained HTML page of a trace (see the module docstring)."""
    from plotly.offline import get_plotlyjs

    steps = trace["steps"]
    sd_times, sd_tokens = cumulative(steps)
    base = trace.get("baseline")
    ar = dict(zip(("times", "tokens"), cumulative(base["steps"]))) if base else None
    data = {"steps": [{"t": s["elapsed_ms"] / 1e3} for s in steps], "sd": {"times": sd_times, "tokens": sd_tokens}, "ar": ar,
            "total": max(sd_tokens[-1], ar["tokens"][-1] if ar else 0, 1)}
    figure = charts.race_figure(race_series(trace)).to_json()
    templates = "".join(f'<template id="n-{i}"><div class="sv-narration">{n}</div></template><template id="m-{i}">{m}</template>'
                        for i, (n, m) in enumerate(step_views(trace), start=1))
    speeds = "".join(f'<option value="{s}"{" selected" if s == 1 else ""}>{s}×</option>' for s in SPEEDS)
    ar_row = ('<div>AR&nbsp;&nbsp;<span class="bar ar" id="ar-bar"></span> <span id="ar-count"></span></div>' if ar else "")
    models = trace.get("models") or {}
    meta = (f"target {models.get('target', '?')} · drafters {', '.join(models.get('drafters', [])) or 'none'} · "
            f"machine {trace.get('machine') or '?'}")
    script = f"const DATA = {json.dumps(data)};\nconst FIGURE = {figure};\n{PAGE_JS}".replace("</", "<\\/")  # no early </script>
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specviz trace: {html.escape(run_label(trace["config"]))}</title>
<style>{token_css()}{microscope_css()}{PAGE_CSS}</style>
<script>{get_plotlyjs()}</script></head>
<body>
<h2>{html.escape(run_label(trace["config"]))}</h2>
<p class="meta">{html.escape(meta)}</p>
<p><b>Prompt:</b> {html.escape(trace["prompt"])}</p>
{headline_html(trace_headline(trace))}
<div class="controls"><button id="prev" title="previous step (←)">◀</button>
<input type="range" id="step" min="1" max="{len(steps)}" value="{len(steps)}" aria-label="step">
<button id="next" title="next step (→)">▶</button><span id="step-label"></span>
<button id="replay">Replay</button><select id="speed" aria-label="replay speed">{speeds}</select><span id="clock"></span>
<button id="present">Presentation mode</button></div>
{legend_html()}
<div id="tokens" class="sv-tokens">{_spans_html(trace)}</div>
<div class="race-bars"><div>SD&nbsp;&nbsp;<span class="bar" id="sd-bar"></span> <span id="sd-count"></span></div>{ar_row}</div>
<div id="race"></div>
<div class="views"><div id="narration"></div><div id="microscope"></div></div>
{templates}
<script>{script}</script>
</body></html>
"""
