"""The TensorFlow layer, the adapters of the engine: the loader and its position variable,
the delivery paths (tf.data and the eager loop), graph arithmetic, tf.distribute input.
The only layer below the integrations that imports TensorFlow."""
