"""The hand-out layer, the engine without TensorFlow: a plan's batches handed out from
any position, counted and checked.

The `engine` (the plan's batches made by the worker backend, with the position after
each), the one restore path (`resume`: a state's position, a position's state), the
stream of a plan's batches with the position after each (`stream`), the live eager
loop (`loop`), who consumes a loader's batches and the integrity checks on every
move of the position (`consumption`), the bad-record policy's quarantine log and
error budget (`quarantine`), and the records of any step (`lineage`). It sits
between the workers (which make batches) and the TensorFlow layer (which delivers
them); nothing here imports TensorFlow.
"""
