"""The built-in batch adapters (openai, anthropic, gemini), thin shells over llm_kit.

Each provider has one wire implementation, llm_kit's: its codecs build the request bodies and its
batch backends frame the lines, talk HTTP, map the statuses and decode the results. The adapters
only translate mmirage's neutral payload and config into llm_kit objects (``_common``) and
llm_kit's outcomes into result rows. ``BatchAdapterRegistry`` imports them lazily, so importing
this package stays cheap.
"""

from __future__ import annotations

from mmirage.errors import WorkFailed


class BatchNotReadyError(WorkFailed, RuntimeError):
    """Results were asked for while the provider batch is still running."""

    def __init__(self, message: str, *, batch_id: str = "", status: str | None = None) -> None:
        super().__init__(message)
        self.batch_id = batch_id
        self.status = status


__all__ = ["BatchNotReadyError"]
