"""The engine: the decoding loop and its StepEvent, the cached-model contract, sampling, acceptance rules, the
drafter contract with the model and n-gram drafters, metrics, the shared formulas and the strategy registries.
It imports nothing else from specviz."""
