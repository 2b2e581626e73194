"""The batch stages: plain (`FixedBatchStage`, `PaddedBatchStage`) and windowed
(`BucketStage`, `TokenBudgetStage`, `PackStage`), with the padding and grouping they
share. Pure NumPy."""

from resumeloader.stages.batching.bucket import BucketStage
from resumeloader.stages.batching.fixed import FixedBatchStage
from resumeloader.stages.batching.pack import PackStage
from resumeloader.stages.batching.padded import PaddedBatchStage
from resumeloader.stages.batching.tokens import TokenBudgetStage

__all__ = [
    "BucketStage",
    "FixedBatchStage",
    "PackStage",
    "PaddedBatchStage",
    "TokenBudgetStage",
]
