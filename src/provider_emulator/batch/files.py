"""`StoredFile`: a file the emulator holds, named apart from the store that keeps it, so that
a job can name its outputs without importing the store (which keeps jobs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True)
class StoredFile:
    """A file the emulator holds: an upload, or results it produced.

    ``id`` is OpenAI's ``file-…`` or Gemini's ``files/…``; ``name`` the OpenAI filename or the
    Gemini display name; ``purpose`` OpenAI's purpose, or Gemini's source (``UPLOADED``,
    ``GENERATED``).
    """

    id: str
    path: Path
    size: int
    created_at: float
    name: str
    purpose: str
    mime_type: str = "application/jsonl"
