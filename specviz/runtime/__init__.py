"""Building a run: the settings (:class:`config.DecodeConfig`), the process's shared models (:mod:`bank`) and
:func:`prepare.prepare`, which turns settings and a prompt into a ready decode."""
