"""The pure core: sampler, positions, record RNG, specs, state. NumPy only, no TensorFlow.

Everything here is a pure function of its arguments, so that the order of records,
the randomness handed to user code and the checkpointed state are the same on any
machine and in any process. Nothing in this layer imports another layer.
"""
