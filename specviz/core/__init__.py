"""The engine: the decoding loop and its recorder, token trees, the cached-model contract, sampling, acceptance rules,
the drafter contract with the model and n-gram drafters, metrics, the shared formulas, the strategy registries and
the environment variables specviz reads. It imports nothing else from specviz."""
