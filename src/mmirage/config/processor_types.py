"""The config side of a processor type: which dataclasses a ``type:`` means in ``processors[]``
and in ``outputs[]``. ``mmirage.core.process.registry.register_processor_type`` fills both
this and the processor class; plugin modules (``mmirage.config.plugins``) call it."""

from __future__ import annotations

from typing import Any

from mmirage.config.processing_params import OUTPUT_TYPES
from mmirage.config.processors import PROCESSOR_TYPES


def register_processor_config(config_cls: type[Any], output_cls: type[Any]) -> str:
    """Make ``type: <config_cls.TYPE>`` valid in YAML; returns the type name. Both classes
    are dataclasses with a ``TYPE`` class variable and a ``type`` field of that value."""
    kind = getattr(config_cls, "TYPE", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{config_cls!r} needs a TYPE class variable naming its processor type")
    if getattr(output_cls, "TYPE", None) != kind:
        raise TypeError(f"{output_cls!r} needs TYPE = {kind!r}, the type of {config_cls!r}")
    for cls in (config_cls, output_cls):
        if "__dataclass_fields__" not in vars(cls):
            raise TypeError(f"{cls!r} must be a @dataclass")
    PROCESSOR_TYPES[kind] = config_cls
    OUTPUT_TYPES[kind] = output_cls
    return kind


__all__ = ["register_processor_config"]
