"""The neutral payload of one request (see ``adapter.py``): what every adapter builds from."""

from __future__ import annotations

from typing import Any

from mmirage.core.process.base import OutputRequest


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
        content = [{"type": "text", "text": prompt}] + [
            {"type": "image_url", "image_url": {"url": resolve_image_url(url)}}
            for url in request.image_urls
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
