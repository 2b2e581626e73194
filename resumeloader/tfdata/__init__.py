"""The TensorFlow layer: the loader, its tf.data delivery, graph arithmetic, the gather
path, eager prefetching and tf.distribute input. The only layer below the integrations
that imports TensorFlow."""
