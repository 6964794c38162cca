"""Entry point for `make run` and Hugging Face Spaces: build the specviz app and serve it.

The environment variables it reads are listed, with their defaults, in ``specviz.core.env.ENV`` (and docs/app.md).
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from specviz.ui.app import build_app, launch  # noqa: E402

demo = build_app()

if __name__ == "__main__":
    launch(demo)
