"""The hand-out layer: batches handed to the consumer, counted and checked, without TensorFlow.

The stream of a plan's batches with the position after each (`stream`), the live
eager loop (`loop`), who consumes a loader's batches and the integrity checks on
every move of the position (`consumption`), and the bad-record policy's quarantine
log and error budget (`quarantine`). It sits between the workers (which make
batches) and the TensorFlow layer (which delivers them); nothing here imports
TensorFlow.
"""
