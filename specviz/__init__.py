"""specviz: a speculative-decoding engine whose every step can be watched.

    import specviz
    trace = specviz.speculate("Explain speculative decoding.", draft="head", gamma=3, baseline=True)
    trace            # in Jupyter: the token view, its legend and the headline numbers
    trace.figure()   # tokens against time, speculative and autoregressive
    trace.save("run.json"); specviz.load_trace("run.json").to_html("run.html")
"""

from specviz.api import Trace, load_trace, speculate, stream
from specviz.core.errors import ConfigError, ModelLoadError
from specviz.core.record import StepEvent
from specviz.runtime.config import DecodeConfig

__all__ = ["ConfigError", "DecodeConfig", "ModelLoadError", "StepEvent", "Trace", "load_trace", "speculate", "stream"]
