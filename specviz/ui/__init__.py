"""The specviz web app (Gradio 6). Depends on the layers below it, never the reverse;
the only package that imports gradio.

Modules: ``app`` builds and launches the Blocks; ``explore``, ``compare``, ``explain`` are the tabs;
``trace`` turns StepEvents into token spans and rows, ``render`` into HTML, ``charts`` into plotly figures;
``stream`` runs a decode in a worker thread; ``state`` holds per-session data; ``bank`` the shared models.
"""

from specviz.ui.app import CSS, THEME, build_app, launch

__all__ = ["CSS", "THEME", "build_app", "launch"]
