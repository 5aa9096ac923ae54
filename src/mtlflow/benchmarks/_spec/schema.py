"""The task spec: a YAML file that describes the user's own multi-task problem, validated by pydantic.

A spec names the source (a CSV or Parquet table, read with pyarrow; a SMILES column makes it a molecule
table), the tasks (name, column(s), kind, metrics), the features, the split and the model. Every error
names the key path, the line of the spec file when there is one, and the fix (:class:`SpecError`, exit 2).
``mtlflow config schema --of spec`` prints the JSON schema of :class:`DataSpec`.
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from mtlflow.core.atomic import parse_yaml, read_yaml
from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.task_types import TASK_TYPES

#: a key path in the spec: ("tasks", 1, "column")
KeyPath = tuple[str | int, ...]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: the widest hidden layer of a spec's model, and the most weights between its hidden layers (4 GB in float32):
#: sizes are checked before anything is allocated (a width of 1e12 would ask the allocator for terabytes)
MAX_HIDDEN_WIDTH = 65536
MAX_HIDDEN_WEIGHTS = 10**9


class SpecError(InvalidParameterError):
    """A problem of the spec or of the data it names; the message starts with ``FILE:LINE: key.path:``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where the rows come from."""

    table: str = Field(description="the table: a local path (relative paths are relative to the spec file), a path "
                                   "inside `repo`, or a URI that fsspec reads (s3://, gs://, https://)")
    format: Literal["csv", "parquet"] | None = Field(None, description="csv or parquet (default: from the suffix)")
    repo: str | None = Field(None, description="a DVC repository (URL or path) that tracks `table`; read with "
                                               "dvc.api at `rev`")
    rev: str | None = Field(None, description="the git revision of `repo` (a tag, branch or commit)")
    smiles: str | None = Field(None, description="the column of SMILES strings: each row is a molecule, turned "
                                                 "into a graph (the model is the MPNN)")
    max_invalid_share: float = Field(0.01, ge=0, le=1, description="share of unparsable SMILES that are skipped "
                                                                   "(counted in the manifest); above it prepare fails")
    images: str | None = Field(None, description="a folder of images (relative paths are relative to the spec file): "
                                                 "each row of `table` is one image, named by `image_column`; the "
                                                 "model is a ResNet")
    image_column: str | None = Field(None, description="images: the column with each row's image path, relative to "
                                                       "`images` (default: image)")
    max_missing_share: float = Field(0.01, ge=0, le=1, description="images: share of rows whose image file is "
                                                                   "missing or unreadable that are skipped (counted "
                                                                   "in the manifest); above it prepare fails")

    @model_validator(mode="after")
    def _consistent(self) -> Source:
        if self.rev is not None and self.repo is None:
            raise ValueError("rev needs repo: give the DVC repository whose revision `rev` is")
        if self.image_column is not None and self.images is None:
            raise ValueError("image_column needs images: give the folder the image paths are relative to")
        if self.images is not None and self.smiles is not None:
            raise ValueError("a source is images or molecules, not both; drop images or smiles")
        return self

    @property
    def image_path_column(self) -> str:
        return self.image_column or "image"


class TaskEntry(_Strict):
    """One task: its label column(s), its kind, and optionally its metrics."""

    name: str = Field(description="the task's name (letters, digits, _ . -)")
    type: Literal["binary", "multiclass", "multilabel", "regression"] = Field(description="the kind of task")
    column: str | None = Field(None, description="the label column (default: the task's name)")
    columns: list[str] | None = Field(None, min_length=2, description="multilabel: one 0/1 column per label")
    positive: str | int | float | bool | None = Field(None, description="binary: the value of the positive class "
                                                                        "(default: 1 / true / the larger value)")
    metrics: list[str] | None = Field(None, min_length=1, description="a subset of the kind's metrics (default: all)")
    primary: str | None = Field(None, description="the metric of Pareto fronts and hypervolume (default per kind)")
    hv_reference: float | None = Field(None, description="hypervolume reference of the primary metric's error "
                                                         "(regression default: twice the training standard "
                                                         "deviation of the target)")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"task name {value!r} must start with a letter or digit and hold only letters, digits, "
                             "_ . -")
        return value

    @model_validator(mode="after")
    def _columns_fit_kind(self) -> TaskEntry:
        if self.type == "multilabel" and not self.columns:
            raise ValueError("a multilabel task needs columns: [label_a, label_b, ...]")
        if self.type != "multilabel" and self.columns:
            raise ValueError(f"columns is for multilabel tasks; a {self.type} task has one column")
        if self.positive is not None and self.type != "binary":
            raise ValueError("positive is for binary tasks")
        kind = TASK_TYPES[self.type]
        valid = [m.name for m in kind.metrics]
        unknown = [m for m in self.metrics or () if m not in valid]
        if unknown:
            raise ValueError(f"metric(s) {unknown} are not {self.type} metrics; valid: {valid}")
        chosen = self.metrics or valid
        if self.primary is not None and self.primary not in chosen:
            raise ValueError(f"primary {self.primary!r} is not among the task's metrics {chosen}")
        return self

    @property
    def label_columns(self) -> list[str]:
        return list(self.columns) if self.columns else [self.column or self.name]


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Augmentation(_Strict):
    """One torchvision transforms v2 class applied to training images (before normalisation)."""

    name: str = Field(description="a class of torchvision.transforms.v2, e.g. RandomHorizontalFlip, "
                                  "RandomResizedCrop, ColorJitter")
    options: dict[str, Any] = Field(default_factory=dict, description="its keyword arguments, e.g. {p: 0.5}")

    @model_validator(mode="after")
    def _builds(self) -> Augmentation:
        self.build()  # an unknown class or a bad option fails when the spec is read, not during training
        return self

    def build(self) -> Any:
        from torchvision.transforms import v2

        transform = getattr(v2, self.name, None)
        if not (isinstance(transform, type) and issubclass(transform, v2.Transform)):
            raise ValueError(f"{self.name!r} is not a torchvision.transforms.v2 transform; use a class name such as "
                             "RandomHorizontalFlip or RandomResizedCrop")
        try:
            return transform(**self.options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.options.items())}) fails: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; fix its options") \
                from None


class ImageFeatures(_Strict):
    """How images become the model's input: resized squares, normalised, augmented in the train split."""

    size: int = Field(64, ge=8, le=1024, description="side of the square every image is resized to (bilinear, "
                                                     "antialiased) when the data is prepared")
    mean: list[float] = Field(default_factory=lambda: list(IMAGENET_MEAN), min_length=3, max_length=3,
                              description="per-channel mean subtracted after scaling to [0, 1] (default: ImageNet's)")
    std: list[PositiveFloat] = Field(default_factory=lambda: list(IMAGENET_STD), min_length=3, max_length=3,
                                     description="per-channel standard deviation divided by (default: ImageNet's)")
    augment: list[Augmentation] = Field(default_factory=list, description="torchvision transforms v2 applied to "
                                                                          "each training image, in order (val and "
                                                                          "test images are not augmented)")


class Features(_Strict):
    """The input columns of a table (a molecule table's input is its SMILES column)."""

    numeric: list[str] | None = Field(None, description="numeric columns (default: every numeric column that is "
                                                        "not a label, split, group or SMILES column)")
    categorical: list[str] = Field(default_factory=list, description="categorical columns, encoded (see "
                                                                     "`encoding`) with the categories of the "
                                                                     "training split")
    encoding: Literal["onehot", "embedding"] = Field("onehot", description="categorical columns: onehot, or "
                                                                          "embedding (a learned nn.Embedding per "
                                                                          "column, index 0 for values the training "
                                                                          "split does not hold)")
    embedding_dim: int | None = Field(None, gt=0, description="encoding embedding: the width of every column's "
                                                              "embedding (default per column: min(50, (categories + "
                                                              "1) // 2), at least 1)")
    standardise: bool = Field(True, description="standardise numeric features with training-split statistics "
                                                "(missing values become the training mean)")
    image: ImageFeatures = Field(default_factory=ImageFeatures, description="images: size, normalisation and "
                                                                            "training augmentations")

    @model_validator(mode="after")
    def _embedding_dim_needs_embedding(self) -> Features:
        if self.embedding_dim is not None and self.encoding != "embedding":
            raise ValueError("embedding_dim is for encoding: embedding; set encoding: embedding or drop embedding_dim")
        return self


class Split(_Strict):
    """Which rows train, validate and test."""

    column: str | None = Field(None, description="a column with the values train / val / test (then the ratios "
                                                 "are not used)")
    val: float = Field(0.1, gt=0, lt=1, description="share of rows for validation")
    test: float = Field(0.2, gt=0, lt=1, description="share of rows for test")
    seed: int = Field(0, ge=0, description="salt of the rows' hashes that decide the split (each row keeps its split "
                                           "when rows are added: mtlflow.benchmarks.row_hashes)")
    key: str | None = Field(None, description="a column identifying each row (e.g. an id): its value decides the "
                                              "row's split, so a row keeps its split when its other cells change "
                                              "(default: the row's cells)")
    stratify: str | None = Field(None, description="a binary or multiclass task whose class shares every split "
                                                   "keeps")
    group: str | None = Field(None, description="a column whose rows stay together in one split (e.g. a customer "
                                                "id)")

    @model_validator(mode="after")
    def _consistent(self) -> Split:
        if self.val + self.test >= 1:
            raise ValueError(f"val + test = {self.val + self.test:g} leaves no training rows; make it below 1")
        if self.stratify is not None and self.group is not None:
            raise ValueError("stratify and group cannot be combined; choose one")
        if self.column is not None and (self.stratify is not None or self.group is not None or self.key is not None):
            raise ValueError("a split column fixes the split; stratify/group/key apply to hashed splits only")
        if self.key is not None and self.group is not None:
            raise ValueError("key and group both name what decides a row's split; choose one")
        return self


class ModelSpec(_Strict):
    """A built-in trunk with one head per task, or a function that returns a MultiTaskModel."""

    trunk: Literal["mlp", "mpnn", "resnet18", "resnet50"] | None = Field(
        None, description="mlp for tables, mpnn for molecules, resnet18 or resnet50 (torchvision) for images "
                          "(default: by the source; images: resnet18)")
    weights: str | None = Field(None, description="resnet: a local file with a torchvision state_dict of the trunk "
                                                  "(relative paths are relative to the spec file; its fc layer is "
                                                  "not used); nothing is ever downloaded (default: random init)")
    hidden: list[int] = Field(default_factory=lambda: [256, 256], min_length=1,
                              description="widths of the MLP's hidden layers (the mpnn uses the first; a resnet's "
                                          "heads read its pooled features directly)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout after each hidden layer of the MLP")
    factory: str | None = Field(None, description="module:function called as function(spec, schema) that returns a "
                                                  "mtlflow.models.MultiTaskModel with one head per task")

    @field_validator("hidden")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(w <= 0 for w in value):
            raise ValueError("hidden widths must be positive integers")
        if max(value) > MAX_HIDDEN_WIDTH:
            raise ValueError(f"hidden width {max(value)} is above the largest, {MAX_HIDDEN_WIDTH}; give smaller widths")
        weights = sum(a * b for a, b in itertools.pairwise(value))
        if weights > MAX_HIDDEN_WEIGHTS:
            raise ValueError(f"hidden widths {value} make {weights:.3g} weights between the hidden layers, above the "
                             f"budget of {MAX_HIDDEN_WEIGHTS:.0e}; give fewer or narrower layers")
        return value

    @model_validator(mode="after")
    def _one_model(self) -> ModelSpec:
        if self.factory is not None and self.trunk is not None:
            raise ValueError("give either trunk or factory, not both")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"factory {self.factory!r} must be module:function")
        if self.weights is not None and not (self.trunk or "").startswith("resnet"):
            raise ValueError("weights are for the resnet18 / resnet50 trunks; set trunk or drop weights")
        return self


class Comparison(_Strict):
    """How the sweep's report compares methods (mtlflow.jobs.compare.headline)."""

    delta_m_metrics: Literal["primary", "all"] = Field(
        "primary", description="the metrics of each task that Δm% and the mean rank average: primary (each task's "
                               "primary metric; the others are shown, not averaged in) or all (every metric but the "
                               "loss)")


class DataSpec(_Strict):
    """A multi-task problem on the user's own data."""

    name: str = Field(description="the data set's name (letters, digits, _ . -), shown in reports")
    source: Source
    tasks: list[TaskEntry] = Field(min_length=1)
    features: Features = Field(default_factory=Features)
    split: Split = Field(default_factory=Split)
    model: ModelSpec = Field(default_factory=ModelSpec)
    train: dict[str, Any] = Field(default_factory=dict, description="training defaults of this data set (any "
                                                                    "`mtlflow train` option: epochs, lr, batch_size)")
    comparison: Comparison = Field(default_factory=Comparison, description="how the report compares methods: "
                                                                          "{delta_m_metrics: primary | all}")
    #: where the spec was read from, for the errors found later in the data
    _location: SpecLocation | None = PrivateAttr(None)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"name {value!r} must start with a letter or digit and hold only letters, digits, _ . -")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> DataSpec:
        names = [t.name for t in self.tasks]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"task name(s) {repeated} appear more than once; give each task a distinct name")
        if self.split.stratify is not None:
            kinds = {t.name: t.type for t in self.tasks}
            classes = [n for n, k in kinds.items() if k in ("binary", "multiclass")]
            if self.split.stratify not in classes:
                raise ValueError(f"split.stratify {self.split.stratify!r} must name a binary or multiclass task "
                                 f"({', '.join(classes) or 'none'})")
        if self.model.trunk == "mpnn" and self.source.smiles is None:
            raise ValueError("model.trunk mpnn needs molecules: set source.smiles to the SMILES column")
        if self.source.smiles is not None and (self.features.numeric or self.features.categorical):
            raise ValueError("a molecule table's input is its SMILES column; drop features.numeric and "
                             "features.categorical")
        if self.model.trunk == "mlp" and self.source.smiles is not None:
            raise ValueError("a molecule table trains the mpnn trunk; drop model.trunk or set it to mpnn")
        resnet = (self.model.trunk or "").startswith("resnet")
        if resnet and self.source.images is None:
            raise ValueError(f"model.trunk {self.model.trunk} needs images: set source.images to the image folder")
        if self.source.images is not None:
            if self.model.trunk is not None and not resnet:
                raise ValueError(f"images train a resnet18 or resnet50 trunk, not {self.model.trunk}; set model.trunk "
                                 "to one of them")
            if self.features.numeric or self.features.categorical:
                raise ValueError("an image table's input is its images; drop features.numeric and "
                                 "features.categorical")
        return self

    @property
    def modality(self) -> str:
        if self.source.images is not None:
            return "images"
        return "molecules" if self.source.smiles is not None else "table"

    @property
    def trunk(self) -> str:
        """The built-in trunk the model uses (the spec's, or the modality's default)."""
        return self.model.trunk or {"images": "resnet18", "molecules": "mpnn", "table": "mlp"}[self.modality]


class SpecLocation:
    """Where a spec came from: its file and the line of each key path (for error messages)."""

    def __init__(self, file: str | None = None, lines: Mapping[KeyPath, int] | None = None):
        self.file = file
        self.lines = dict(lines or {})

    def where(self, path: KeyPath) -> str:
        """``FILE:LINE: key.path`` (the nearest enclosing key with a known line)."""
        key = format_key_path(path)
        if self.file is None:
            return f"spec {key}" if key else "spec"
        for depth in range(len(path), -1, -1):
            if path[:depth] in self.lines:
                return f"{self.file}:{self.lines[path[:depth]]}: {key}" if key else f"{self.file}:{self.lines[()]}"
        return f"{self.file}: {key}" if key else self.file

    def error(self, path: KeyPath, message: str) -> SpecError:
        return SpecError(f"{self.where(path)}: {message}")


def spec_json_schema() -> dict[str, Any]:
    """The JSON schema of a task spec file (``mtlflow config schema --of spec``; editors validate with it)."""
    schema = DataSpec.model_json_schema()
    schema["description"] = "mtlflow task spec: " + " ".join((DataSpec.__doc__ or "").split())
    return schema


def format_key_path(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def yaml_key_lines(text: str) -> dict[KeyPath, int]:
    """The 1-based line of every key path of a YAML document (a value's line, or its key's for mappings)."""
    lines: dict[KeyPath, int] = {}

    def walk(node: Any, path: KeyPath) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                lines[path + (key.value,)] = key.start_mark.line + 1
                walk(value, path + (key.value,))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, path + (index,))

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, ())
    return lines


def parse_spec(values: Any, location: SpecLocation | None = None) -> DataSpec:
    """A validated :class:`DataSpec`, or a :class:`SpecError` naming the first problem's key path and line."""
    location = location or SpecLocation()
    if not isinstance(values, Mapping):
        raise location.error((), f"a spec is a mapping with name, source and tasks, not {type(values).__name__}")
    try:
        return DataSpec.model_validate(dict(values))
    except ValidationError as exc:
        first = exc.errors()[0]
        path = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith(("function-", "literal"))))
        raise location.error(path, _message(first)) from None


def _message(error: Mapping[str, Any]) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a spec key; see `mtlflow config schema --of spec` for the valid keys"
    if kind == "literal_error":
        return f"{error['input']!r} is not valid: {message.lower()}"
    return message.removeprefix("Value error, ")


class SpecFile(_Strict):
    """A spec file tracked in a git (+ DVC) repository, read at a revision: the ``spec`` value
    ``{repo: URL, path: specs/churn.yaml, rev: v2}``."""

    repo: str = Field(description="the git repository (URL or path) that holds the spec file, plain or DVC-tracked")
    path: str = Field(description="the spec file's path inside the repository")
    rev: str | None = Field(None, description="the git revision (tag, branch, commit; default: the repository's "
                                              "HEAD)")

    @property
    def name(self) -> str:
        return f"{self.path} of {self.repo}@{self.rev or 'HEAD'}"


def spec_file_location(value: str) -> SpecFile | None:
    """The repository location a ``spec`` value names (an inline mapping ``{repo: ..., path: ..., rev: ...}``),
    or None for a path or URI."""
    if not value.lstrip().startswith("{"):
        return None

    try:
        values = yaml.safe_load(value)
        return SpecFile.model_validate(values)
    except (yaml.YAMLError, ValidationError) as exc:
        reason = exc.errors()[0] if isinstance(exc, ValidationError) else None
        detail = f"{'.'.join(map(str, reason['loc']))}: {_message(reason)}" if reason else "not a YAML mapping"
        raise SpecError(f"spec {value!r} is not a spec location ({detail}); give a spec file's path or URI, or "
                        "{repo: URL, path: FILE, rev: REVISION}") from None


def read_spec(path: str | Path, rev: str | None = None) -> DataSpec:
    """Read and validate a spec file: a local path, a URI that fsspec reads, or a file in a git (+ DVC)
    repository (:func:`spec_file_location`) at its revision, or at ``rev`` when given. A relative
    ``source.table`` is relative to the spec file's folder (in a repository: a path of that repository at
    the same revision)."""
    name = str(path)
    in_repo = spec_file_location(name) if isinstance(path, str) else None
    if in_repo is not None:
        if rev:
            in_repo = in_repo.model_copy(update={"rev": rev})
        name = in_repo.name
        text = _read_repo_text(in_repo)
        values = parse_yaml(text, name, "spec file")
        folder = posixpath.dirname(in_repo.path)
    elif "://" in name:
        text = _read_remote_text(name)
        values = parse_yaml(text, name, "spec file")
        folder = posixpath.dirname(name)
    else:
        values = read_yaml(path, "spec file")  # syntax errors as FILE:LINE:COL
        text = Path(path).read_text(encoding="utf-8")
        folder = str(Path(path).resolve().parent)
    location = SpecLocation(name, yaml_key_lines(text))
    spec = parse_spec(values, location)

    def beside_the_spec(path: str, key: KeyPath) -> str:
        if "://" in path or posixpath.isabs(path):
            return path
        if in_repo is not None:
            raise location.error(key, f"{path!r} is relative, and a spec read from a repository finds local files "
                                      "and folders only by absolute path; give an absolute path (e.g. on the data "
                                      "volume)")
        return posixpath.join(folder, path) if "://" in folder else str(Path(folder, path).resolve())

    if in_repo is not None and spec.source.repo is None and "://" not in spec.source.table \
            and not posixpath.isabs(spec.source.table):
        # the table beside the spec: the same repository at the same revision
        source = {"table": posixpath.normpath(posixpath.join(folder, spec.source.table)), "repo": in_repo.repo,
                  "rev": in_repo.rev}
    else:
        source = {"table": spec.source.table if spec.source.repo else
                  beside_the_spec(spec.source.table, ("source", "table"))}
    if spec.source.images is not None:
        source["images"] = beside_the_spec(spec.source.images, ("source", "images"))
    update: dict[str, Any] = {"source": spec.source.model_copy(update=source)}
    if spec.model.weights is not None:
        update["model"] = spec.model.model_copy(update={"weights": beside_the_spec(spec.model.weights,
                                                                                   ("model", "weights"))})
    spec = spec.model_copy(update=update)
    spec._location = location
    return spec


def _read_repo_text(location: SpecFile) -> str:
    import dvc.api

    try:
        return dvc.api.read(location.path, repo=location.repo, rev=location.rev, encoding="utf-8")
    except Exception as exc:  # dvc raises many types (PathMissingError, RevError, SCMError, ...)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"spec file {location.name} cannot be read ({reason}); check repo, path and rev") from None


def _read_remote_text(uri: str) -> str:
    import fsspec

    try:
        with fsspec.open(uri, "rt", encoding="utf-8") as fh:
            return fh.read()
    except Exception as exc:  # fsspec backends raise their own types
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"spec file {uri} cannot be read ({reason}); check the URI and its credentials") from None


def with_revision(spec: DataSpec, rev: str) -> DataSpec:
    """``spec`` reading its DVC-tracked table at git revision ``rev``."""
    if spec.source.repo is None:
        raise location_of(spec).error(("source", "repo"), f"a table revision ({rev}) needs source.repo, the DVC "
                                                          "repository that tracks the table")
    return spec.model_copy(update={"source": spec.source.model_copy(update={"rev": rev})})


def location_of(spec: DataSpec) -> SpecLocation:
    """Where ``spec`` was read from (no file: a spec given as a mapping)."""
    return spec._location or SpecLocation()
