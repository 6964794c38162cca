"""The specviz web app (Gradio 6). Depends on the layers below it, never the reverse;
the only package that imports gradio.

Modules: ``app`` builds and launches the Blocks; ``explore``, ``compare``, ``explain`` are the tabs (layout and
handlers); ``controls`` generates the settings controls from DecodeConfig's fields; ``handlers`` holds what every
handler shares. Without gradio: ``runs`` and ``comparison`` model a run and a comparison (state, metrics, exports),
``state`` the per-session data, ``decode`` and ``stream`` run a decode, ``bank`` holds the shared models.
"""

from specviz.ui.app import CSS, THEME, build_app, launch

__all__ = ["CSS", "THEME", "build_app", "launch"]
