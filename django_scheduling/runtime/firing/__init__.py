"""The firing pipeline: decide, claim, hand over (invoke or enqueue), record, release.

See ``pipeline.py`` for the path a firing takes, in order.
"""

from .pipeline import FiringPipeline
from .spec import TaskSpec

__all__ = ["FiringPipeline", "TaskSpec"]
