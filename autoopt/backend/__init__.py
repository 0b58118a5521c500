"""Stage 6, backend: run a config for real.

``kernels`` holds the Triton kernels; ``registry`` maps a kernel name to its launch, inputs and
reference; ``runner`` validates a config (an invalid one never launches), poisons the output,
checks it against a float64 reference and only then times it; ``bench`` and ``plot`` run a suite
beside torch and draw its roofline. torch and triton are imported here and in later stages only.
"""
