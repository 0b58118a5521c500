"""Stage 5, planning: how to run a whole model on a whole machine.

``model`` and ``catalog`` describe models (``ModelSpec`` from the catalog, an HF config or an
``nn.Module``); ``quant`` the weight formats; ``memory`` what fits; ``split`` how layers and tensors
divide over devices; ``schedule`` how jobs share devices; ``chain`` the per-layer plan (DP/WFC);
``recommendation`` the pipeline that ties them into ``recommend()``. Uses ``search`` per op (a cold
start reads the shipped rank cache instead of ranking); ``startup`` regenerates that cache and the
YAML mirrors (``python benchmarks/regen_startup_cache.py``).
"""
