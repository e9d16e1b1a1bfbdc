"""``processing_params``: input variables, outputs in declared order, the final row schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator

from mmirage.config.errors import FieldError
from mmirage.config.fields import NonEmptyStr, PositiveFloat, PositiveInt
from mmirage.config.output_schema import OutputSchema, parse_output_schema


def _check_identifier(name: str) -> None:
    # Variables are used as Jinja names, so they must be identifiers.
    if not name.isidentifier():
        raise FieldError("name", f"must be a valid identifier (letters, digits, _), got {name!r}")


@dataclass
class InputVar:
    """A per-row variable: ``key`` is a JMESPath expression into the row."""

    name: str
    key: NonEmptyStr
    type: Literal["text", "image"] = "text"
    optional: bool = False  # a missing field gives None instead of failing the row

    def __post_init__(self) -> None:
        _check_identifier(self.name)
        import jmespath  # small, pure Python; compiled here so a typo fails at load
        from jmespath.exceptions import JMESPathError

        try:
            jmespath.compile(self.key)
        except JMESPathError as exc:
            first_line = str(exc).splitlines()[0].rstrip(":")
            raise FieldError(
                "key", f"is not a valid JMESPath expression ({first_line}): {self.key!r}"
            ) from None


def _output_type(value: object) -> object:
    # Any case: "json" meaning plain text would silently drop the schema.
    if value is None or value == "":
        return "plain"
    if isinstance(value, str) and value.strip().lower() in ("json", "plain"):
        return "JSON" if value.strip().lower() == "json" else "plain"
    return value


OutputType = Annotated[Literal["plain", "JSON"], BeforeValidator(_output_type)]


@dataclass
class _TextOutput:
    """Shared by ``llm`` and ``batch_api`` outputs: a prompt, plain text or JSON."""

    name: str
    prompt: NonEmptyStr
    output_type: OutputType = "plain"
    output_schema: Any = None
    processor: str | None = None
    # Parsed form of ``output_schema``; filled in by __post_init__.
    schema: OutputSchema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_identifier(self.name)
        try:
            self.schema = parse_output_schema(self.output_schema, self.name)
        except FieldError as exc:
            raise FieldError(
                f"output_schema.{exc.field}" if exc.field else "output_schema", str(exc)
            ) from None
        if self.output_type == "JSON" and not self.schema:
            raise FieldError(
                "output_schema",
                f"output '{self.name}' has output_type JSON but no output_schema; list the "
                "fields to return (names, name: type, or name: {type, min, max})",
            )
        if self.output_type != "JSON" and self.schema:
            raise FieldError(
                "output_schema", "is only used with output_type: JSON; remove it or set output_type"
            )

    @property
    def is_json(self) -> bool:
        return self.output_type == "JSON"


@dataclass
class LLMOutput(_TextOutput):
    TYPE: ClassVar[str] = "llm"
    type: Literal["llm"] = "llm"


@dataclass
class BatchApiOutput(_TextOutput):
    TYPE: ClassVar[str] = "batch_api"
    type: Literal["batch_api"] = "batch_api"


@dataclass
class CustomOutput:
    """The custom function receives the row's variables and returns the value."""

    TYPE: ClassVar[str] = "custom"

    name: str
    type: Literal["custom"] = "custom"
    processor: str | None = None

    def __post_init__(self) -> None:
        _check_identifier(self.name)


DEFAULT_FILENAME_TEMPLATE = "generated_{{ __shard_id }}_{{ __sample_index }}_{{ __source_hash }}"


@dataclass
class ImageGenOutput:
    TYPE: ClassVar[str] = "image_gen"
    # Variables the image writer provides to filename_template.
    BUILTIN_VARIABLES: ClassVar[frozenset[str]] = frozenset(
        {"__shard_id", "__sample_index", "__source_hash"}
    )

    name: str
    type: Literal["image_gen"] = "image_gen"
    prompt: str = ""
    negative_prompt: str = ""
    output_mode: Literal["path", "pil"] = "path"
    filename_template: NonEmptyStr = DEFAULT_FILENAME_TEMPLATE
    width: PositiveInt | None = None
    height: PositiveInt | None = None
    num_inference_steps: PositiveInt | None = None
    guidance_scale: PositiveFloat | None = None
    seed: int | None = None
    processor: str | None = None

    def __post_init__(self) -> None:
        _check_identifier(self.name)


OutputVar = LLMOutput | BatchApiOutput | CustomOutput | ImageGenOutput

OUTPUT_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (LLMOutput, BatchApiOutput, CustomOutput, ImageGenOutput)
}


@dataclass
class ProcessingParams:
    """``inputs`` and ``outputs`` arrive already typed: the loader dispatches on ``type``."""

    inputs: list[InputVar]
    outputs: list[OutputVar]
    output_schema: dict[str, Any]
    remove_columns: bool = False
    cast_images: bool = True
    # Rows' image paths are data: by default an absolute path or file:// URL must lie inside
    # the dataset's image_base_path (relative ones always must). True allows any local file.
    allow_absolute_image_paths: bool = False
