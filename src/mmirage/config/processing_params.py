"""``processing_params``: input variables, outputs in declared order, the final row schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator

from mmirage.config.errors import FieldError
from mmirage.config.fields import NonEmptyStr, PositiveFloat, PositiveInt, is_field_path
from mmirage.config.output_schema import OutputSchema, parse_output_schema
from mmirage.config.reserved import RESERVED_COLUMNS, reserved_problem


def _check_identifier(name: str) -> None:
    # Variables are used as Jinja names, so they must be identifiers.
    if not name.isidentifier():
        raise FieldError("name", f"must be a valid identifier (letters, digits, _), got {name!r}")


@dataclass
class InputVar:
    """One entry of ``processing_params.inputs``: a per-row variable read from the row."""

    name: str
    """The variable's name in prompts and in `output_schema` (`{{ name }}`); an identifier."""
    key: NonEmptyStr
    """A JMESPath expression into the row, e.g. `question` or `conversations[0].content`."""
    type: Literal["text", "image"] = "text"
    """`image`: the value is an image (a local path, an http(s) or data URL, or a list of them),
    checked and sent with each prompt of the row; `text`: any other value."""
    optional: bool = False
    """A missing or null value gives `None` instead of failing the row."""

    def __post_init__(self) -> None:
        _check_identifier(self.name)
        if is_field_path(self.key):
            return  # valid as it is: no JMESPath to import
        import jmespath  # compiled here so a typo fails at load
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
    """The output's variable name, usable in later prompts and in `output_schema`; an
    identifier."""
    prompt: NonEmptyStr
    """A Jinja template over the row's inputs and earlier outputs (`{{ question }}`)."""
    output_type: OutputType = "plain"
    """`plain`: the answer's text; `JSON`: an object with the fields of `output_schema`,
    validated (any case)."""
    output_schema: Any = None
    """For `output_type: JSON`, the fields to answer with: a list of names (strings), or
    `name: type` (`str`, `int`, `float`, `bool`, `object`, `list[<type>]`), or
    `name: {type, min, max}` / `{type: str, enum: [...]}`."""
    processor: str | None = None
    """The `name` of the processor that computes this output, when several of its type exist."""
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
    """An ``outputs[]`` entry of ``type: llm``: a prompt answered live by an ``llm``
    processor."""

    TYPE: ClassVar[str] = "llm"
    type: Literal["llm"] = "llm"
    """`llm`: computed by an `llm` processor."""


@dataclass
class BatchApiOutput(_TextOutput):
    """An ``outputs[]`` entry of ``type: batch_api``: a prompt submitted to a provider batch API;
    the shard holds a placeholder until ``mmirage merge`` fills in the answer."""

    TYPE: ClassVar[str] = "batch_api"
    type: Literal["batch_api"] = "batch_api"
    """`batch_api`: computed by a `batch_api` processor."""


@dataclass
class CustomOutput:
    """An ``outputs[]`` entry of ``type: custom``: the custom function receives the row's
    variables and returns the value."""

    TYPE: ClassVar[str] = "custom"

    name: str
    """The output's variable name, usable in later prompts and in `output_schema`; an
    identifier."""
    type: Literal["custom"] = "custom"
    """`custom`: computed by a `custom` processor."""
    processor: str | None = None
    """The `name` of the processor that computes this output, when several of its type exist."""

    def __post_init__(self) -> None:
        _check_identifier(self.name)


DEFAULT_FILENAME_TEMPLATE = "generated_{{ __shard_id }}_{{ __sample_index }}_{{ __source_hash }}"


@dataclass
class ImageGenOutput:
    """An ``outputs[]`` entry of ``type: image_gen``: accepted and checked so that the original
    MMIRAGE's configs load; no processor computes it yet."""

    TYPE: ClassVar[str] = "image_gen"
    # Variables the image writer provides to filename_template.
    BUILTIN_VARIABLES: ClassVar[frozenset[str]] = frozenset(
        {"__shard_id", "__sample_index", "__source_hash"}
    )

    name: str
    """The output's variable name; an identifier."""
    type: Literal["image_gen"] = "image_gen"
    """`image_gen`: would be computed by an `image_gen` processor."""
    prompt: str = ""
    """A Jinja template: what to draw."""
    negative_prompt: str = ""
    """A Jinja template: what the image should not show."""
    output_mode: Literal["path", "pil"] = "path"
    """`path`: the value is the written file's path; `pil`: the image itself."""
    filename_template: NonEmptyStr = DEFAULT_FILENAME_TEMPLATE
    """A Jinja template for the file name; `__shard_id`, `__sample_index` and `__source_hash`
    are provided."""
    width: PositiveInt | None = None
    """Image width in pixels. Unset: the model's default."""
    height: PositiveInt | None = None
    """Image height in pixels. Unset: the model's default."""
    num_inference_steps: PositiveInt | None = None
    """Denoising steps. Unset: the model's default."""
    guidance_scale: PositiveFloat | None = None
    """How closely the image follows the prompt. Unset: the model's default."""
    seed: int | None = None
    """Seed of the generation. Unset: random."""
    processor: str | None = None
    """The `name` of the processor that computes this output, when several of its type exist."""

    def __post_init__(self) -> None:
        _check_identifier(self.name)


OutputVar = LLMOutput | BatchApiOutput | CustomOutput | ImageGenOutput

OUTPUT_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (LLMOutput, BatchApiOutput, CustomOutput, ImageGenOutput)
}


@dataclass
class ProcessingParams:
    """``processing_params``: the variables read from each row, the outputs computed from them,
    and the shape of each result row. (``outputs`` arrive typed: the loader dispatches on
    ``type``.)"""

    inputs: list[InputVar]
    """The per-row variables read from each input row."""
    outputs: list[OutputVar]
    """What is computed per row, in this order: each output's `type` names the processor type,
    and a later output's prompt may use an earlier one."""
    output_schema: dict[str, Any]
    """The result row: column name to a Jinja template over inputs and outputs
    (`answer: "{{ answer }}"`). A leaf that is exactly `{{ name }}` keeps the value's type (a
    JSON output stays an object); nested mappings and lists are rendered leaf by leaf."""
    remove_columns: bool = False
    """`true`: a result row holds only the `output_schema` columns; `false`: the source row's
    columns are kept, and the schema's are added or overwritten."""
    cast_images: bool = True
    """Accepted so that the original MMIRAGE's configs load (it cast `image_gen` image paths
    to images); no effect yet, since no `image_gen` processor runs."""
    allow_absolute_image_paths: bool = False
    """Rows' image paths are data: by default an absolute path or `file://` URL must lie inside
    the dataset's `image_base_path` (relative ones always must). `true` allows any local
    file."""

    def __post_init__(self) -> None:
        for column in self.output_schema:
            if column in RESERVED_COLUMNS:
                raise FieldError(f"output_schema.{column}", reserved_problem(column))
