"""The fleet: evaluations spread over every GPU of a host, one worker process per GPU, or over a Ray cluster.

- :mod:`~autoopt.fleet.pool`: the local pool (spawned workers pinned with ``CUDA_VISIBLE_DEVICES``,
  one item in flight per worker, crashed workers restarted and their item retried once, hung items
  timed out, first result wins, the parent alone sees results, costliest item first);
- :mod:`~autoopt.fleet.ray_backend`: the same rules with one Ray actor per GPU of a cluster;
- :mod:`~autoopt.fleet.worker`: the worker loop and its evaluators (default, tuning, bench);
- :mod:`~autoopt.fleet.devices`: ``--gpus all|0,1,3`` against this host's GPUs;
- :mod:`~autoopt.fleet.cost`: what an evaluation costs, for longest-first dispatch;
- :mod:`~autoopt.fleet.jobs`: ``autoopt tune|bench --gpus|--ray`` on the pool;
- :mod:`~autoopt.fleet.inventory`: ``autoopt fleet``.
"""

from autoopt.fleet.pool import Item, LocalPool, Outcome, PoolStats, run_pool

__all__ = ["Item", "LocalPool", "Outcome", "PoolStats", "run_pool"]
