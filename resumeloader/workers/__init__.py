"""Workers: how batch tasks become batches, in order — in the calling thread, in threads, in
worker processes or on a Dask cluster. No TensorFlow here (process workers must stay light)."""
