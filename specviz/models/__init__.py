"""Models: presets, loading (preset, hub id, local directory, the offline GGUF), prompt encoding and stop ids,
and the backend boundary (:mod:`specviz.models.backends`) with the CPU kernels and the lean forward."""
