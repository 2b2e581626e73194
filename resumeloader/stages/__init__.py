"""Stages: the pure functions of (seed, epoch, position) that define a loader's stream.

`Pipeline` composes them; `Plan` binds a pipeline to epochs and a shard. The contract
every stage keeps is in ARCHITECTURE.md ("The stage contract"). No TensorFlow here.
"""

from resumeloader.stages.base import (
    Batches,
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
from resumeloader.stages.pipeline import Pipeline
from resumeloader.stages.plan import Plan, Task
from resumeloader.stages.sampler import SamplerStage
from resumeloader.stages.tf_map import TFMapStage

__all__ = [
    "BatchMapStage",
    "BatchStage",
    "Batches",
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
    "Pipeline",
    "PlainBatchStage",
    "Plan",
    "RecordStage",
    "SamplerStage",
    "Stage",
    "TFMapStage",
    "Task",
    "TensorStage",
    "TokenBudgetStage",
    "WindowedBatchStage",
]
