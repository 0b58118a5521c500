"""The fleet: evaluations spread over every GPU of a host, one worker process per GPU.

- :mod:`~autoopt.fleet.pool`: the local pool (spawned workers pinned with ``CUDA_VISIBLE_DEVICES``,
  one item in flight per worker, crashed workers restarted and their item retried once, hung items
  timed out, first result wins, the parent alone sees results);
- :mod:`~autoopt.fleet.worker`: the worker loop and the default evaluator.
"""

from autoopt.fleet.pool import Item, Outcome, PoolStats, run_pool

__all__ = ["Item", "Outcome", "PoolStats", "run_pool"]
