"""Kept importable at its old path; the module is ``mmirage.core.render.variables``."""

from mmirage.core.render.variables import *  # noqa: F403
