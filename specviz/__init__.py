"""specviz: a speculative-decoding engine whose every step can be watched."""
