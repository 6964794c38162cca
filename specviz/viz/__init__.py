"""Views of a run without gradio: token spans and their HTML (:mod:`trace`, :mod:`render`) and plotly charts
(:mod:`charts`). The app, the notebook view and exported files all use them."""
