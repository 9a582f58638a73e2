"""A hardware profile file's JSON schema (pydantic): the shapes and types of its fields and of each
coefficient's source. Ranges, coefficient names and tables are checked by granisim.config.hardware, which
turns a validation error into one line naming the file, the field and the value."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MeasuredSource(_Strict):
    kind: Literal["measured"]
    date: str = Field(min_length=1)
    command: str = Field(min_length=1)
    gpu: str | None = None
    commit: str | None = None
    versions: str | None = None
    note: str | None = None


class PublishedSource(_Strict):
    kind: Literal["published"]
    citation: str = Field(min_length=1)
    note: str | None = None


class ExtrapolatedSource(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    kind: Literal["extrapolated"]
    from_: str = Field(alias="from", min_length=1)
    how: str = Field(min_length=1)
    note: str | None = None


SourceModel = Union[MeasuredSource, PublishedSource, ExtrapolatedSource]


class CoefficientModel(_Strict):
    value: float
    unit: str
    source: SourceModel = Field(discriminator="kind")


class LinearTableModel(_Strict):
    file: str = Field(min_length=1)
    model: dict[str, int]
    scaling: str = Field(min_length=1)
    source: SourceModel = Field(discriminator="kind")


class KernelTableModel(_Strict):
    file: str = Field(min_length=1)
    model: dict[str, int]
    source: SourceModel = Field(discriminator="kind")


class StepClassesModel(_Strict):
    factors: dict[str, dict[str, dict[str, float]]]  # model -> policy -> class of step -> factor
    source: SourceModel = Field(discriminator="kind")


class ProfileModel(_Strict):
    schema_: Literal["granikv-hardware-profile/1"] = Field(alias="schema")
    name: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    notes: str = ""
    linear_table: LinearTableModel | None = None
    more_linear_tables: list[LinearTableModel] = []  # measured at other model shapes
    kernel_table: KernelTableModel | None = None
    step_classes: StepClassesModel | None = None
    coefficients: dict[str, CoefficientModel]
