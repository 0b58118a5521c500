"""autoopt plugin for datacenter Blackwell (tcgen05) GEMMs; see :mod:`autoopt_blackwell.plugin`."""

__version__ = "0.1.0"
