"""The research methods built on the core loop: γ policies and draft selection, polybasic chains, the
feature-head drafter, published EAGLE-3 heads, judge decoding and the acceptance predictor. Importing this package
imports every module in it, so a strategy in a new file here registers itself (γ policies, acceptance rules, drafter kinds) with no
other edit."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
