"""Settings controls generated from :class:`DecodeConfig`'s fields: a control's label, help, range and choices come
from its field's Setting, a choice's description from the strategy registry it names, and which controls a chosen
strategy reads from its registered parameters. A form's values reach a handler as keyword arguments named after the
settings, and become a config in one place (:func:`specviz.ui.state.form_config`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import gradio as gr

from specviz.core.registry import ACCEPT_RULES, DRAFTERS, GAMMA_POLICIES, Registry
from specviz.models.presets import PRESETS, resolve_draft
from specviz.runtime.config import APP_MAX_NEW_TOKENS, DecodeConfig
from specviz.runtime.prepare import BASELINE_SETTINGS, run_preset
from specviz.ui.bank import default_draft, default_preset, draft_choices
from specviz.ui.handlers import user_message
from specviz.ui.state import form_config
from specviz.viz.render import status_html

SETTINGS = DecodeConfig.settings()
TYPES = {f.name: f.type for f in fields(DecodeConfig)}
DEFAULTS = {f.name: f.default_factory() if f.default is MISSING else f.default for f in fields(DecodeConfig)}
UI_MAX_NEW_TOKENS = APP_MAX_NEW_TOKENS
"""The max-new-tokens sliders' maximum: the endpoint's cap."""
SLIDER_SPAN = 4096
"""A numeric range at most this wide is a slider; a wider (or open) one a number box."""
QUIET = {"api_visibility": "private", "queue": False}
"""Small callbacks: not part of the app's API, and not queued behind decodes."""


def registry_of(name: str) -> Registry | None:
    """The strategy registry whose names are setting ``name``'s choices, if any."""
    options = SETTINGS[name].options()
    return next((r for r in (GAMMA_POLICIES, ACCEPT_RULES, DRAFTERS) if options and options == tuple(r)), None)


def describe(name: str, value: Any) -> str:
    """The help under a control: the chosen strategy's description, or the setting's help."""
    registry = registry_of(name)
    if registry is not None and value in registry:
        return f"{value}: {registry.entry(value).description}"
    return preset_info(value) if name == "preset" else SETTINGS[name].help


def readers() -> dict[str, tuple[str, Registry]]:
    """Settings read by some strategies of a registry and not by others, each with the setting that chooses the
    strategy: their controls show only while the chosen strategy reads them."""
    found = {}
    for name in SETTINGS:
        registry = registry_of(name)
        if registry is None:
            continue
        params = [set(entry.params) for entry in registry.entries()]
        some = set.union(*params) - set.intersection(*params)
        found.update({p: (name, registry) for p in SETTINGS if p in some})
    return found


def reads(param: str, choice: Any) -> bool:
    chooser, registry = readers()[param]
    return choice in registry and param in registry.entry(choice).params


def preset_info(preset: str) -> str:
    p = PRESETS.get(preset)
    return f"{p.description}. Target: `{p.target}`." if p else "Unknown preset."


def preset_choices(name: str, preset: str) -> dict:
    """What a Setting cannot know: the presets, and the chosen preset's drafts for every draft setting."""
    if name == "preset":
        return {"choices": list(PRESETS), "value": preset}
    if name == "draft":
        return {"choices": draft_choices(preset), "value": default_draft(preset)}
    if TYPES[name] == "list[str]":
        return {"choices": [value for _, value in draft_choices(preset)]}
    return {}


def setting_control(name: str, prefix: str, **kw: Any) -> gr.components.Component:
    """The control of setting ``name`` (inside a Blocks context); ``kw`` overrides its value, a lower ``maximum`` or
    the choices a preset gives."""
    s, kind = SETTINGS[name], TYPES[name]
    value = kw.pop("value", DEFAULTS[name])
    kw = {"value": value, "label": s.label or name, "info": describe(name, value), "elem_id": f"{prefix}-{name.replace('_', '-')}", **kw}
    if s.choices is not None:
        options = list(s.options())
        return gr.Radio(options, **kw) if len(options) <= 3 and registry_of(name) is None else gr.Dropdown(options, **kw)
    if kind == "bool":
        return gr.Checkbox(**kw)
    if kind in ("int", "float"):
        step, high = (1 if kind == "int" else 0.01), kw.pop("maximum", s.high)
        if s.low is not None and high is not None and high - s.low <= SLIDER_SPAN:
            return gr.Slider(s.low + step * s.open_low, high - step * s.open_high, step=step, **kw)
        return gr.Number(precision=0 if kind == "int" else None, **kw)
    if "choices" in kw:
        return gr.Dropdown(multiselect=kind == "list[str]", allow_custom_value=name != "preset", **kw)
    return gr.Textbox(**{**kw, "value": value or ""})


@dataclass
class SettingsForm:
    """Controls of some settings, by setting name, added where the layout places them; a setting a chosen strategy
    reads follows its chooser and shows only while it is read."""

    prefix: str
    preset: str = field(default_factory=default_preset)
    controls: dict[str, gr.components.Component] = field(default_factory=dict)

    def add(self, names: Iterable[str], **overrides: dict) -> None:
        """A control for each setting of ``names`` not added yet (``overrides``: keyword arguments by setting)."""
        conditional = readers()
        for name in names:
            if name in self.controls or name in conditional and conditional[name][0] not in self.controls:
                continue
            kw = {**preset_choices(name, self.preset), **overrides.get(name, {})}
            if name in conditional:
                kw.setdefault("visible", reads(name, DEFAULTS[conditional[name][0]]))
            self.controls[name] = setting_control(name, self.prefix, **kw)
            self.add([p for p, (chooser, _) in conditional.items() if chooser == name], **overrides)

    def inputs(self) -> list[gr.components.Component]:
        return list(self.controls.values())

    def names(self) -> list[str]:
        return list(self.controls)

    def check(self, *values: Any) -> str:
        """Validate the settings as they change (no model is touched): '' or a visible one-line message."""
        try:
            config = form_config(dict(zip(self.controls, values)))
            if config.method == "sd" and config.draft:
                resolve_draft(run_preset(config), config.draft)
        except Exception as exc:  # never let a settings check break the page
            return status_html(user_message(exc), "warn")
        return ""

    def wire(self, hint: gr.HTML) -> None:
        """The small callbacks: preset → its drafts, a chosen strategy → its description and the settings it reads,
        method → whether the drafting settings apply, and the live settings check."""
        c = self.controls
        if "preset" in c:
            lists = [n for n in c if n != "preset" and preset_choices(n, self.preset)]
            c["preset"].change(lambda preset: on_preset_change(preset, lists), c["preset"], [c["preset"], *(c[n] for n in lists)],
                               **QUIET)
        conditional = readers()
        for name in c:
            if registry_of(name) is None:
                continue
            shown = [p for p, (chooser, _) in conditional.items() if chooser == name and p in c]
            c[name].change(lambda value, name=name, shown=shown: (gr.update(info=describe(name, value)),
                                                                  *(gr.update(visible=reads(p, value)) for p in shown)),
                           c[name], [c[name], *(c[p] for p in shown)], **QUIET)
        if "method" in c:
            drafting = [n for n in c if n not in BASELINE_SETTINGS and n != "method"]
            c["method"].change(lambda method: tuple(gr.update(interactive=method == "sd") for _ in drafting), c["method"],
                               [c[n] for n in drafting], **QUIET)
        gr.on([x.change for x in self.inputs()], self.check, self.inputs(), hint, **QUIET)


def on_preset_change(preset: str, lists: list[str]) -> tuple:
    """The preset's description, and its drafts as the choices (and default) of every draft setting."""
    if preset not in PRESETS:
        return (gr.skip(),) * (1 + len(lists))
    return gr.update(info=preset_info(preset)), *(gr.update(**preset_choices(n, preset), **({} if n == "draft" else {"value": []}))
                                                   for n in lists)


def form_handler(fn: Callable, before: list[str], form: SettingsForm, after: list[str]) -> Callable:
    """``fn(**values)`` as a gradio handler of the inputs ``[*before, *form.inputs(), *after]``: its signature names
    every input, so the app's API takes them as keyword arguments (``gamma=3``)."""
    names = [*before, *form.names(), *after]
    if inspect.isgeneratorfunction(fn):
        def handler(*values: Any) -> Any:
            yield from fn(**dict(zip(names, values)))
    else:
        def handler(*values: Any) -> Any:
            return fn(**dict(zip(names, values)))
    handler.__signature__ = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    handler.__name__, handler.__doc__ = fn.__name__, fn.__doc__
    return handler
