"""Kept importable at its old path; the module is ``mmirage.core.render.renderer``."""

from mmirage.core.render.renderer import *  # noqa: F403
