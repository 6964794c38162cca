"""The research methods built on the core loop: γ policies and draft selection, polybasic chains, the
feature-head drafter, judge decoding and the acceptance predictor. Importing this package registers every
strategy (γ policies, acceptance rules, drafter kinds) in :mod:`specviz.core.registry`."""

from specviz.methods import chain, feature_head, judge, policies, predictor, selection  # noqa: F401
