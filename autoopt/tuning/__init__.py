"""Stage 7, tuning: measure once, remember forever.

``tuner`` runs the budgeted propose -> evaluate -> keep loop for one op (cost-model proposals,
one-knob neighbours of the best measured config, a stop rule that knows the model's error) through
the backend runner; measured winners go to the results store (:mod:`autoopt.results`), where
``rank()``, ``recommend()`` and start-up lookups find them.
"""
