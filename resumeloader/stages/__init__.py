"""Stages: the pure functions of (seed, epoch, position) that define a loader's stream.

The library's stages (each a builder method of `resumeloader.Pipeline` makes one) and
the bases a stage of your own subclasses, with what a batch stage's `group` returns
(`Group`) and raises (`GroupError`). The contract every stage keeps — among it, that a
stage holds no seed and receives the pipeline's with the epoch — is in ARCHITECTURE.md
("The stage contract"). How a pipeline is bound to epochs and a shard (`plan.Plan`,
`plan.Task`) and what a batch stage hands the producer (`base.Batches`) are the
library's own plumbing. No TensorFlow here.
"""

from resumeloader.stages.base import (
    BatchMapStage,
    BatchStage,
    Group,
    GroupError,
    IndexStage,
    PlainBatchStage,
    RecordStage,
    Stage,
    TensorStage,
    WindowedBatchStage,
)
from resumeloader.stages.batching import (
    BucketStage,
    FixedBatchStage,
    PackStage,
    PaddedBatchStage,
    TokenBudgetStage,
)
from resumeloader.stages.blocks import BlockStage
from resumeloader.stages.map import MapStage
from resumeloader.stages.map_batch import MapBatchStage
from resumeloader.stages.mix import MixStage
from resumeloader.stages.sampler import SamplerStage
from resumeloader.stages.tf_map import TFMapStage

__all__ = [
    "BatchMapStage",
    "BatchStage",
    "BlockStage",
    "BucketStage",
    "FixedBatchStage",
    "Group",
    "GroupError",
    "IndexStage",
    "MapBatchStage",
    "MapStage",
    "MixStage",
    "PackStage",
    "PaddedBatchStage",
    "PlainBatchStage",
    "RecordStage",
    "SamplerStage",
    "Stage",
    "TFMapStage",
    "TensorStage",
    "TokenBudgetStage",
    "WindowedBatchStage",
]
