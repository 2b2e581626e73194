"""Stages: the pure functions of (seed, epoch, position) that define a loader's stream.

`Pipeline` composes them; `Plan` binds a pipeline to epochs and a shard. See
`resumeloader.stages.base` for the contract every stage keeps. No TensorFlow here.
"""

from resumeloader.stages.base import (
    BatchStage,
    Group,
    GroupError,
    IndexStage,
    RecordStage,
    Stage,
    TensorStage,
)
from resumeloader.stages.batch import FixedBatchStage
from resumeloader.stages.bucket import BucketStage
from resumeloader.stages.map import MapStage
from resumeloader.stages.mix import MixStage
from resumeloader.stages.pack import PackStage
from resumeloader.stages.padded import PaddedBatchStage
from resumeloader.stages.pipeline import Pipeline
from resumeloader.stages.plan import Plan, Task
from resumeloader.stages.sampler import SamplerStage
from resumeloader.stages.tf_map import TFMapStage
from resumeloader.stages.tokens import TokenBudgetStage

__all__ = [
    "BatchStage",
    "BucketStage",
    "FixedBatchStage",
    "Group",
    "GroupError",
    "IndexStage",
    "MapStage",
    "MixStage",
    "PackStage",
    "PaddedBatchStage",
    "Pipeline",
    "Plan",
    "RecordStage",
    "SamplerStage",
    "Stage",
    "TFMapStage",
    "Task",
    "TensorStage",
    "TokenBudgetStage",
]
