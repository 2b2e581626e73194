"""Workers: how batch tasks become batches, in order — in the calling thread, in a thread
pool or in spawned processes. No TensorFlow here (process workers must stay light)."""
