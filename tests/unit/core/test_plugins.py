"""Plug-ins through the registries, in this process: import paths (``module:attribute``) of the example
package (examples/plugin_package/, on sys.path here, not installed) name benchmarks, methods and
architectures everywhere a built-in name goes; objects of the wrong kind, modules that fail to import,
entry points that clash with a built-in or with each other, and broken entry points are one-line usage
errors. (Installed through its entry points and driven through the CLI: tests/integration/test_plugin_package.py.)
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from mtlflow import benchmarks, methods
from mtlflow.config.run import RunConfig
from mtlflow.core import registry
from mtlflow.core.errors import InvalidParameterError, UnknownNameError, UsageError
from mtlflow.models import architectures

PACKAGE = Path(__file__).resolve().parents[3] / "examples" / "plugin_package"
BENCHMARK = "churn_plugin.tasks:Churn"
METHOD = "churn_plugin.methods:UnitGradientSum"
ARCHITECTURE = "churn_plugin.models:wide_mlp"


@pytest.fixture(autouse=True)
def example_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PACKAGE))


def usage_error(call, *args) -> str:
    """The message of the UsageError that ``call(*args)`` raises, checked to be one line."""
    with pytest.raises(UsageError) as exc:
        call(*args)
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)
    return str(exc.value)


def test_an_import_path_names_a_class_known_by_that_path() -> None:
    """Manifests and run directories record ``bench.name``: for an import path it is the path, so the run
    rebuilds from the record alone."""
    bench = benchmarks.build(BENCHMARK, rows=50)
    assert bench.name == BENCHMARK and bench.task_names == ["churn", "spend"]
    assert benchmarks.get(BENCHMARK) is benchmarks.get(BENCHMARK)  # one class per path
    method = methods.build(METHOD, 2, 0, eps=1e-6)
    assert method.name == METHOD and method.hp == {"eps": 1e-6}
    assert methods.info(METHOD).family == "gradient-manipulation"
    assert methods.origin(METHOD) == "churn_plugin.methods" and benchmarks.origin("toy") == "mtlflow"
    from churn_plugin.methods import UnitGradientSum

    assert isinstance(method, UnitGradientSum) and UnitGradientSum.name == "unitsum"  # the user's class is untouched


def test_the_run_configuration_accepts_plugin_names() -> None:
    config = RunConfig(method=METHOD, architecture=ARCHITECTURE, architecture_options={"width": 8},
                       hparams={"eps": 1e-9})
    assert config.method == METHOD
    with pytest.raises(InvalidParameterError, match="unknown architecture option.*valid: depth, width"):
        RunConfig(architecture=ARCHITECTURE, architecture_options={"height": 8})
    with pytest.raises(InvalidParameterError, match="width=.*must be of type int"):
        RunConfig(architecture=ARCHITECTURE, architecture_options={"width": "wide"})


def test_a_plugin_architecture_builds_and_rebuilds_from_its_record(tmp_path: Path) -> None:
    bench = benchmarks.build(BENCHMARK, rows=50, features=3)
    model = architectures.build_model(bench, ["spend"], ARCHITECTURE, {"width": 5})
    spec = architectures.architecture_spec(model)
    assert spec == {"name": ARCHITECTURE, "options": {"width": 5, "depth": 2}}
    assert model.trunk[0].out_features == 5 and model.task_names == ["spend"]
    torch.save({"spec": spec}, tmp_path / "model.pt")  # the record goes through torch.save, as model.pt does
    rebuilt = architectures.rebuild_model(bench, ["spend"], torch.load(tmp_path / "model.pt")["spec"])
    assert architectures.architecture_spec(rebuilt) == spec
    assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in model.parameters()]


def test_a_plugin_model_must_have_one_head_per_task_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "factories.py").write_text("def every_task(bench, task_names):\n    return bench.make_model()\n\n\n"
                                           "def no_model(bench, task_names):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    bench = benchmarks.build(BENCHMARK, rows=50)
    message = usage_error(architectures.build_model, bench, ["spend"], "factories:every_task")
    assert "factories:every_task built heads for tasks churn, spend, not for spend; build one head per task" in message
    message = usage_error(architectures.build_model, bench, ["spend"], "factories:no_model")
    assert "factories:no_model returned a dict, not a MultiTaskModel" in message


@pytest.mark.parametrize("lookup,name,fragment", [
    (methods.get, "no_such_pkg.sub:Method",
     "cannot import no_such_pkg.sub:Method (ModuleNotFoundError: No module named 'no_such_pkg'); install the package "
     "or fix the path"),
    (methods.get, "churn_plugin.methods:NoSuchMethod",
     "cannot import churn_plugin.methods:NoSuchMethod (churn_plugin.methods has no attribute 'NoSuchMethod')"),
    (methods.get, BENCHMARK, "method churn_plugin.tasks:Churn is the class churn_plugin.tasks.Churn, not a subclass "
     "of mtlflow.methods.base.Method"),
    (benchmarks.get, ARCHITECTURE, "benchmark churn_plugin.models:wide_mlp is the function "
     "churn_plugin.models.wide_mlp, not a subclass of mtlflow.benchmarks.base.Benchmark"),
    (benchmarks.get, "churn_plugin.tasks:HELD_OUT_SHARE", "is a float, not a subclass"),
    (benchmarks.get, "mtlflow.benchmarks.base:Benchmark", "is the class mtlflow.benchmarks.base.Benchmark, not a "
     "subclass"),
    (methods.get, "mtlflow.methods.base:GradientMethod", "does not define paper"),
    (architectures.resolve, "churn_plugin.tasks:HELD_OUT_SHARE", "is a float, not a model factory"),
    (architectures.resolve, "mtlflow.models.base:MultiTaskModel", "is the class mtlflow.models.base.MultiTaskModel, "
     "not a model factory factory(bench, task_names, **options) -> MultiTaskModel with a default for every option"),
    (methods.get, ":Method", "must look like module:attribute"),
])
def test_a_bad_import_path_is_one_line_saying_what_it_names(lookup, name: str, fragment: str) -> None:
    args = (name, None) if lookup is architectures.resolve else (name,)
    assert fragment in usage_error(lookup, *args)


def test_a_module_that_raises_while_importing_is_reported_in_one_line(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "half_written.py").write_text("import json\n\nraise RuntimeError('config.yaml\\nnot found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert usage_error(methods.get, "half_written:Method") == (
        "cannot import half_written:Method (RuntimeError: config.yaml not found); install the package or fix the path")


def registry_with(monkeypatch: pytest.MonkeyPatch, *declared: tuple[str, str]) -> registry.Registry:
    """A method registry whose installed entry points are ``declared`` ``(name, "module:attribute")`` pairs."""
    points = [EntryPoint(name, value, "mtlflow.methods") for name, value in declared]
    monkeypatch.setattr(registry, "entry_points", lambda group: [p for p in points if p.group == group])
    return registry.Registry("method", "mtlflow.methods", methods.REGISTRY.builtins,
                             registry.subclass_of(methods.Method, "method", ("paper",)))


def test_entry_points_are_listed_and_loaded_under_their_name(monkeypatch: pytest.MonkeyPatch) -> None:
    found = registry_with(monkeypatch, ("normalised", METHOD))
    assert "normalised" in found.names() and set(methods.available()) < set(found.names())
    cls = found.get("normalised")
    assert cls.name == "normalised" and cls.__qualname__ == "UnitGradientSum"
    assert found.origin("normalised") == "an unknown distribution" and found.origin("ls") == registry.BUILT_IN
    with pytest.raises(UnknownNameError) as exc:
        found.get("normalized")
    assert exc.value.valid == found.names()


@pytest.mark.parametrize("declared,fragment", [
    ([("fairgrad", METHOD)], "two methods are named 'fairgrad': the built-in mtlflow.methods.fairgrad:FairGrad of "
     "mtlflow and entry point fairgrad = churn_plugin.methods:UnitGradientSum of an unknown distribution"),
    ([("unitsum", METHOD), ("unitsum", "other_pkg:Unit")], "two methods are named 'unitsum': entry point unitsum = "
     "churn_plugin.methods:UnitGradientSum of an unknown distribution and entry point unitsum = other_pkg:Unit"),
])
def test_a_name_declared_twice_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch, declared, fragment) -> None:
    found = registry_with(monkeypatch, *declared)
    assert fragment in usage_error(found.names)
    assert fragment in usage_error(found.get, "ls")  # even the built-in: which one was meant is unclear


def test_a_broken_entry_point_is_one_line_with_the_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    found = registry_with(monkeypatch, ("broken", "no_such_pkg:Method"))
    assert "broken" in found.names()  # listed without importing it
    assert usage_error(found.get, "broken") == (
        "cannot import entry point broken = no_such_pkg:Method of an unknown distribution (ModuleNotFoundError: No "
        "module named 'no_such_pkg'); reinstall an unknown distribution or fix its entry point")
