"""The interleaved benchmark (:mod:`harness`): configurations compared prompt by prompt, as ratios."""
