"""The processors that compute outputs, behind one contract (``base.Processor``) and one
registry keyed by processor type (``registry``)."""

from mmirage.core.process.base import OutputRequest, OutputResult, Processor, RunContext
from mmirage.core.process.registry import ProcessorRegistry, register_processor_type

__all__ = [
    "OutputRequest",
    "OutputResult",
    "Processor",
    "ProcessorRegistry",
    "RunContext",
    "register_processor_type",
]
