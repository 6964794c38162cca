"""Offline training: the distilled draft models and their data, the feature head, the judge dataset and head, and
the acceptance predictor. Nothing at decode time imports this package."""
