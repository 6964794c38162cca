"""Settings controls shared by the tabs, their small callbacks (preset → drafts, rule → parameters, live
settings check) and the error handling every handler uses."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr

from specviz.analysis.suites import load_suite
from specviz.core.errors import ConfigError, ModelLoadError
from specviz.core.registry import ACCEPT_RULES, GAMMA_POLICIES, Registry
from specviz.models.presets import PRESETS, resolve_draft, resolve_preset
from specviz.runtime.config import DecodeConfig
from specviz.ui.bank import default_draft, default_preset, draft_choices
from specviz.ui.state import make_config
from specviz.viz.render import status_html

log = logging.getLogger("specviz.ui")

USER_ERRORS = (ConfigError, ModelLoadError)
UI_MAX_NEW_TOKENS = 512


SETTINGS = DecodeConfig.settings()
RULE_PARAMS = ("judge_threshold", "lenience", "topk")  # the acceptance rules' parameters, shown for the rule that reads them
BASELINE_AFTER, BASELINE_BEFORE, BASELINE_SKIP = "after the run", "before the run", "skip"


def decode_concurrency() -> int:
    """Decodes running at once across all sessions (SPECVIZ_DECODE_CONCURRENCY, default 1): runs never share the
    CPU/GPU, so their timings stay honest; other sessions wait in the queue and see their position."""
    try:
        return max(1, int(os.environ.get("SPECVIZ_DECODE_CONCURRENCY", "1")))
    except ValueError:
        return 1


def user_message(exc: BaseException) -> str:
    """One line for the UI: user mistakes verbatim, anything else named as unexpected (and logged)."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    log.exception("unexpected error in a handler")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"unexpected error ({type(exc).__name__}){': ' + first[:300] if first else ''} — the app is still running"


def notify(message: str) -> None:
    """A toast in the browser (best effort: outside a request there is nobody to tell)."""
    try:
        gr.Warning(message)
    except Exception:
        pass


def guarded(frames: Callable[[], Iterator[tuple]], on_error: Callable[[str], tuple]) -> Iterator[tuple]:
    """Run a handler's generator; any exception becomes a visible error frame instead of a crash."""
    try:
        yield from frames()
    except Exception as exc:
        message = user_message(exc)
        notify(message)
        yield on_error(message)


def example_prompts() -> tuple[list[list[str]], list[str]]:
    """Prompts of the benchmark suites as gr.Examples rows, with 'category: prompt' labels."""
    try:
        items = interleave_categories(load_suite("all"))
    except Exception:
        items = []
    rows = [[it["prompt"]] for it in items]
    labels = [f"{it['category']}: {it['prompt'][:70]}{'…' if len(it['prompt']) > 70 else ''}" for it in items]
    return rows, labels


def interleave_categories(items: list[dict]) -> list[dict]:
    """Round-robin over categories, so the first page of examples shows one prompt of each."""
    by_cat: dict[str, list[dict]] = {}
    for it in items:
        by_cat.setdefault(it["category"], []).append(it)
    rounds = max((len(v) for v in by_cat.values()), default=0)
    return [group[i] for i in range(rounds) for group in by_cat.values() if i < len(group)]


def default_prompt() -> str:
    rows, _ = example_prompts()
    return rows[0][0] if rows else "Write a short poem about the sea."


def preset_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in PRESETS]


def preset_info(preset: str) -> str:
    p = PRESETS.get(preset)
    return f"{p.description}. Target: `{p.target}`." if p else "Unknown preset."


@dataclass
class DecodeControls:
    """The per-run settings controls (used by Explore; Compare reuses the sampling ones)."""

    preset: gr.Dropdown
    method: gr.Radio
    draft: gr.Dropdown
    gamma: gr.Slider
    gamma_policy: gr.Dropdown
    accept: gr.Dropdown
    judge_threshold: gr.Slider
    lenience: gr.Slider
    topk: gr.Number
    chain: gr.Dropdown
    select: gr.Dropdown
    temperature: gr.Slider
    top_p: gr.Slider
    seed: gr.Number
    max_new_tokens: gr.Slider
    chat: gr.Checkbox

    def inputs(self) -> list[gr.components.Component]:
        return [self.preset, self.method, self.draft, self.gamma, self.gamma_policy, self.accept, self.judge_threshold,
                self.lenience, self.topk, self.chain, self.select, self.temperature, self.top_p, self.seed,
                self.max_new_tokens, self.chat]


def preset_dropdown(prefix: str, preset: str | None = None) -> gr.Dropdown:
    preset = preset or default_preset()
    return gr.Dropdown(preset_choices(), value=preset, label="Preset", info=preset_info(preset), elem_id=f"{prefix}-preset")


def max_tokens_slider(max_new_tokens: int, prefix: str) -> gr.Slider:
    return gr.Slider(1, UI_MAX_NEW_TOKENS, value=max_new_tokens, step=1, label="Max new tokens", elem_id=f"{prefix}-max-tokens")


def sampling_controls(prefix: str) -> tuple[gr.Slider, gr.Slider, gr.Number, gr.Checkbox]:
    """Temperature, top-p, seed and the chat-template switch (inside an accordion)."""
    temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature", info="0 = greedy (exact SD then reproduces AR token for token)",
                            elem_id=f"{prefix}-temperature")
    top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p", elem_id=f"{prefix}-top-p")
    seed = gr.Number(0, precision=0, label="Seed", elem_id=f"{prefix}-seed")
    chat = gr.Checkbox(True, label="Apply the chat template", elem_id=f"{prefix}-chat")
    return temperature, top_p, seed, chat


def decode_controls(preset: str | None = None, max_new_tokens: int = 64) -> DecodeControls:
    """Build the Explore settings column (must be called inside a Blocks context)."""
    preset = preset or default_preset()
    preset_dd = preset_dropdown("explore", preset)
    method = gr.Radio([("speculative (sd)", "sd"), ("autoregressive (ar)", "ar")], value="sd", label="Method", elem_id="explore-method")
    draft = gr.Dropdown(draft_choices(preset), value=default_draft(preset), label="Draft", allow_custom_value=True,
                        info="A draft of the preset, 'ngram', a hub id or a local directory", elem_id="explore-draft")
    gamma = setting_slider("gamma", 1, elem_id="explore-gamma")
    gamma_policy = registry_dropdown("gamma_policy", GAMMA_POLICIES, elem_id="explore-gamma-policy")
    accept = registry_dropdown("accept", ACCEPT_RULES, elem_id="explore-accept")
    judge = setting_slider("judge_threshold", 0.01, visible=False)
    lenience = setting_slider("lenience", 0.01, visible=False)
    k = SETTINGS["topk"]
    topk = gr.Number(DecodeConfig.topk, precision=0, minimum=k.low, maximum=k.high, label=k.label, visible=False, info=k.help)
    max_tokens = max_tokens_slider(max_new_tokens, "explore")
    with gr.Accordion("Sampling (temperature, top-p, seed, chat template)", open=False):
        temperature, top_p, seed, chat = sampling_controls("explore")
    with gr.Accordion("Polybasic chain and draft selection", open=False):
        names = [v for _, v in draft_choices(preset)]
        chain = gr.Dropdown(names, value=[], multiselect=True, allow_custom_value=True, label="Chain (fastest first; target implied last)")
        select = gr.Dropdown(names, value=[], multiselect=True, allow_custom_value=True, label="Select among drafts per step")
    return DecodeControls(preset_dd, method, draft, gamma, gamma_policy, accept, judge, lenience, topk, chain, select,
                          temperature, top_p, seed, max_tokens, chat)


def on_preset_change(preset: str) -> tuple:
    """New draft choices (and default) for the chosen preset, and its description."""
    if preset not in PRESETS:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    choices = draft_choices(preset)
    names = [v for _, v in choices]
    return (gr.update(choices=choices, value=default_draft(preset)), gr.update(info=preset_info(preset)),
            gr.update(choices=names, value=[]), gr.update(choices=names, value=[]))


def setting_slider(name: str, step: float, **kw) -> gr.Slider:
    """A slider over a DecodeConfig setting's range (an open end moves in by one step), labelled by the setting."""
    s = SETTINGS[name]
    low, high = s.low + step * s.open_low, s.high - step * s.open_high
    return gr.Slider(low, high, value=getattr(DecodeConfig, name), step=step, label=s.label, info=s.help, **kw)


def registry_dropdown(name: str, registry: Registry, **kw) -> gr.Dropdown:
    """A dropdown over a strategy registry: every registered name, each strategy's description as the info."""
    s = SETTINGS[name]
    info = "; ".join(f"{e.name}: {e.description}" for e in registry.entries())
    return gr.Dropdown(list(registry), value=getattr(DecodeConfig, name), label=s.label, info=info, **kw)


def on_accept_change(accept: str) -> tuple:
    """Show only the parameters the chosen acceptance rule reads (from its registry entry)."""
    params = ACCEPT_RULES.entry(accept).params if accept in ACCEPT_RULES else ()
    return tuple(gr.update(visible=name in params) for name in RULE_PARAMS)


def on_method_change(method: str) -> tuple:
    speculative = method == "sd"
    return tuple(gr.update(interactive=speculative) for _ in range(4))


def settings_check(preset, method, draft, gamma, gamma_policy, accept, judge_threshold, lenience, topk, chain, select,
                   temperature, top_p, seed, max_new_tokens, chat) -> str:
    """Validate the settings as they change (no model is touched): '' or a visible one-line message."""
    try:
        config = make_config(preset=preset, method=method, draft=draft, gamma=gamma, gamma_policy=gamma_policy, accept=accept,
                             judge_threshold=judge_threshold, lenience=lenience, topk=topk, chain=chain, select=select,
                             temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, chat=chat)
        if config.method == "sd" and config.draft:
            resolve_draft(resolve_preset(config.preset), config.draft)
    except USER_ERRORS as exc:
        return status_html(str(exc), "warn")
    except Exception as exc:  # never let a settings check break the page
        return status_html(user_message(exc), "warn")
    return ""


def wire_decode_controls(c: DecodeControls, hint: gr.HTML) -> None:
    """Attach the small callbacks: preset → drafts, rule → parameter, method → draft controls, live check."""
    c.preset.change(on_preset_change, c.preset, [c.draft, c.preset, c.chain, c.select], api_visibility="private", queue=False)
    c.accept.change(on_accept_change, c.accept, [c.judge_threshold, c.lenience, c.topk], api_visibility="private", queue=False)
    c.method.change(on_method_change, c.method, [c.draft, c.gamma, c.gamma_policy, c.accept], api_visibility="private", queue=False)
    gr.on([x.change for x in c.inputs()], settings_check, c.inputs(), hint, api_visibility="private", queue=False)
