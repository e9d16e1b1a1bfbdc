"""The neutral payload of one request (see ``adapter.py``): what every adapter builds from."""

from __future__ import annotations

from typing import Any

from llm_kit.errors import ImageTypeError
from mmirage.core.process.base import OutputRequest
from mmirage.errors import UserError


def modality_of(request: OutputRequest) -> str:
    """``multimodal`` when the row has images, else ``text``: a batch is homogeneous."""
    return "multimodal" if request.image_urls else "text"


def custom_id_for(output_name: str, modality: str, source_index: int) -> str:
    """``<output_name>-<modality>-<request_number>``; the number is the row's global
    ``source_index``, so ids are unique over shards, datasets and outputs, and the same
    request keeps its id on every run and resubmission."""
    return f"{output_name}-{modality}-{source_index}"


def build_payload(
    request: OutputRequest, output: Any, schema: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Messages in OpenAI chat format, local images inlined as data URLs (so they count in
    ``max_chunk_bytes``), http(s) URLs as given; the JSON schema for JSON outputs (``schema``
    when the caller has it computed already)."""
    from llm_kit.images import resolve_image_url

    prompt = request.prompt or ""
    content: str | list[dict[str, Any]]
    if request.image_urls:
        # Typed by extension, as the batch page promises (the bytes must be an image's).
        urls = [resolve_image_url(url, typed_by_extension=True) for url in request.image_urls]
        content = [{"type": "text", "text": prompt}] + [
            {"type": "image_url", "image_url": {"url": url}} for url in urls
        ]
    else:
        content = prompt
    payload: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
    if getattr(output, "is_json", False):
        payload["response_schema"] = schema or output.schema.json_schema()
        payload["expected_schema"] = output.schema.names
    else:
        payload["response_schema"] = None
    return payload


def image_type_refused(provider: str, request: OutputRequest, exc: ImageTypeError) -> UserError:
    """The run's error for an image the provider does not take: raised before submission, as
    the batch page says, naming the row and its files (give them their correct extension)."""
    files = ", ".join(repr(url) for url in request.image_urls)
    return UserError(
        f"row {request.row_key}: an image of {files} is {exc.media_type} (its extension's "
        f"type), which provider {provider} does not take ({exc}); give the file its correct "
        "extension or convert it, then run again (nothing of this row was submitted)"
    )
