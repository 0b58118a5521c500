"""Stage 4, search: which kernel config to run for one op on one GPU.

``ranking`` asks every plugin's templates for candidates, rejects the invalid ones and ranks the
rest by the cost model with an exact branch-and-bound search (no timing); ``rank_cache`` answers a
cold ``recommend()``'s ops from the shipped, precomputed rankings of the built-in GPUs (checked
current on every use); ``calibration`` fits the cost model's constants to measured timings.
"""
