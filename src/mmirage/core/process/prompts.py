"""Kept importable at its old path; the module is ``mmirage.core.render.prompts``."""

from mmirage.core.render.prompts import *  # noqa: F403
