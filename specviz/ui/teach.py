"""Teaching controls shared by Explore and Compare: step through a run with buttons or the ← / → keys (during and
after decoding), the narration and the verification microscope of the current step, and the step highlighted in
the token view. A panel shows a *view*: a trace file's content (live runs build theirs step by step), kept in the
browser session under the panel's key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gradio as gr

from specviz.ui.state import ensure_session
from specviz.viz.export import plain_ms_per_token
from specviz.viz.teach import highlight_css, microscope_html, narrate

KEYS_JS = """
() => {
  if (window.__specvizKeys) return;
  window.__specvizKeys = true;
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (t && (t.tagName === 'TEXTAREA' || (t.tagName === 'INPUT' && t.type !== 'range'))) return;
    const which = e.key === 'ArrowLeft' ? 'prev' : e.key === 'ArrowRight' ? 'next' : null;
    if (!which) return;
    const button = [...document.querySelectorAll('button[id$="-step-' + which + '"]')].find(b => b.offsetParent !== null);
    if (button) { button.click(); e.preventDefault(); }
  });
}
"""
"""Clicks the visible panel's ◀ / ▶ on ← / → (outside text fields)."""


@dataclass
class StepPanel:
    tokens_id: str
    prev: gr.Button
    step: gr.Number
    next: gr.Button
    narration: gr.HTML
    microscope: gr.HTML

    def outputs(self) -> list:
        return [self.step, self.narration, self.microscope]


def build_step_panel(prefix: str, tokens_id: str) -> StepPanel:
    """◀ step ▶, the narration and the microscope (inside a Blocks context); ``tokens_id`` is the token view to mark."""
    with gr.Row(equal_height=True):
        prev = gr.Button("◀ previous step", elem_id=f"{prefix}-step-prev", size="sm", scale=0, min_width=150)
        step = gr.Number(0, precision=0, minimum=0, label="Step (← / → keys)", elem_id=f"{prefix}-step", scale=0, min_width=140)
        nxt = gr.Button("next step ▶", elem_id=f"{prefix}-step-next", size="sm", scale=0, min_width=150)
    with gr.Row(equal_height=False):
        narration = gr.HTML(empty_narration(), elem_id=f"{prefix}-narration")
        microscope = gr.HTML("", elem_id=f"{prefix}-microscope")
    return StepPanel(tokens_id, prev, step, nxt, narration, microscope)


def empty_narration() -> str:
    return '<div class="sv-narration">Run something (or load a trace): each step is narrated here, and the microscope shows its ' \
           "verification: p, q, min(1, p/q) and the draw u.</div>"


def view_update(view: Mapping | None, k: int | None, tokens_id: str) -> tuple:
    """Step ``k`` of ``view`` (clamped; None: the last): the step number, its narration with the step marked in the token
    view, and its microscope."""
    steps = (view or {}).get("steps") or []
    if not steps:
        return 0, empty_narration(), ""
    k = len(steps) if k is None else max(1, min(len(steps), int(k)))
    event, pieces = steps[k - 1], view["pieces"]
    mark = f"<style>{view.get('selector', '#' + tokens_id)} {highlight_css(event['step'])}</style>"
    narration = f'{mark}<div class="sv-narration">{narrate(event, pieces, plain_ms_per_token(view))}</div>'
    return k, narration, microscope_html(event, pieces)


def wire_step_panel(panel: StepPanel, session: gr.State, key: gr.components.Component | str) -> None:
    """◀ / ▶ / typed step numbers move through the view stored under ``key`` (a fixed name, or a component whose value
    names it); stepping back from the end stops following a live run, stepping to the end follows it again."""
    keys = [key] if isinstance(key, gr.components.Component) else []

    def view_of(session: dict | None, *name) -> dict | None:
        return ensure_session(session)["views"].get(name[0] if name else key)

    def move(delta: int):
        def handler(k, session, *name):
            view = view_of(session, *name)
            if not view:
                return view_update(None, None, panel.tokens_id)
            target = int(k or 0) + delta
            view["follow"] = target >= len(view["steps"])
            return view_update(view, target, panel.tokens_id)
        return handler

    for button, delta in ((panel.prev, -1), (panel.next, 1)):
        button.click(move(delta), [panel.step, session, *keys], panel.outputs(), api_visibility="private", queue=False,
                     show_progress="hidden")
    panel.step.submit(move(0), [panel.step, session, *keys], panel.outputs(), api_visibility="private", queue=False,
                      show_progress="hidden")


def live_panel(view: Mapping, tokens_id: str) -> tuple:
    """The panel's outputs while a run streams: the newest step when following, else unchanged."""
    if not view.get("follow", True):
        return gr.skip(), gr.skip(), gr.skip()
    return view_update(view, None, tokens_id)
