"""The typed summary of a comparison (mtlflow.jobs.compare): every reader asks for fields that exist (the templates'
attribute paths are checked against the records' fields, an unknown one fails), results.json is the exact JSON of
the record and reads back to it, each evaluation file is read once, and a train call reads the manifest once."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path

import pytest
from jinja2 import UndefinedError, nodes
from test_aggregate_statistics import all_runs, references
from test_paired_versus import write_run

from mtlflow import jobs
from mtlflow.core.errors import DataError
from mtlflow.jobs import report
from mtlflow.jobs.compare import loading
from mtlflow.jobs.compare.summary import Summary, from_json, read_summary, to_json

REPO_ROOT = Path(__file__).resolve().parents[3]


def _record_type(kind: typing.Any) -> typing.Any:
    """``kind`` without ``| None``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
    return kind


def unknown_fields(path: tuple[str, ...]) -> str | None:
    """The first name of an attribute path below the summary (``("statistics", "confidence")``) that is not a field
    of the record it is asked of; None when every record on the path has it (past a record, a mapping's or a
    value's own attributes, e.g. ``.items``, are not fields)."""
    kind: typing.Any = Summary
    for name in path:
        if not dataclasses.is_dataclass(kind):
            return None
        fields = typing.get_type_hints(kind)
        if name not in fields:
            return f"{kind.__name__}.{name}"
        kind = _record_type(fields[name])
    return None


def template_paths(source: str) -> set[tuple[str, ...]]:
    """Every attribute path a template asks of ``s`` (the summary), e.g. ``s.statistics.interval``, and its
    prefixes."""
    paths = set()
    for node in report._environment().parse(source).find_all(nodes.Getattr):
        names = []
        while isinstance(node, nodes.Getattr):
            names.append(node.attr)
            node = node.node
        if isinstance(node, nodes.Name) and node.name == "s":
            paths.add(tuple(reversed(names)))
    return paths


def test_every_field_the_templates_ask_of_the_summary_exists():
    templates = sorted(report.TEMPLATES.glob("*.j2"))
    asked = [(t.name, p) for t in templates for p in sorted(template_paths(t.read_text()))]
    assert len(asked) > 20 and any(p == ("statistics", "confidence") for _, p in asked)  # the check sees them
    assert [(name, unknown_fields(p)) for name, p in asked if unknown_fields(p)] == []


def test_the_field_check_fails_on_a_field_that_does_not_exist():
    assert template_paths("{{ s.statistics.confidense }} {{ s.methods.items() }} {{ other.x }}") == {
        ("statistics", "confidense"), ("statistics",), ("methods", "items"), ("methods",)}
    assert unknown_fields(("statistics", "confidense")) == "StatisticsRule.confidense"
    assert unknown_fields(("paper_references", "metrics", "items")) is None
    assert unknown_fields(("hypervolume_normalised", "scale")) is None


@pytest.fixture(scope="module")
def summary() -> Summary:
    return jobs.summarise(all_runs(), references(), paper_references=False)


@pytest.mark.parametrize("text", ["{{ s.no_such_field }}", "{% if s.statistics.no_such_field %}x{% endif %}",
                                  "{{ s.methods['ls'].delta_mm }}"])
def test_a_template_asking_for_an_unknown_field_fails_to_render(summary, text):
    with pytest.raises(UndefinedError):
        report._environment().from_string(text).render(s=summary)


def test_a_python_reader_asking_for_an_unknown_field_fails(summary):
    with pytest.raises(AttributeError):
        summary.methods["ls"].delta_m_interval  # noqa: B018 -- the JSON key, not the record's field
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.best_method = "ls"


def test_results_json_is_the_summary_and_reads_back_to_it(summary, tmp_path):
    report.write_report(summary, all_runs(), tmp_path)
    text = (tmp_path / "results.json").read_text()
    assert text == json.dumps(to_json(summary), indent=2) + "\n"
    again = read_summary(tmp_path / "results.json")
    assert again == summary or json.dumps(to_json(again), indent=2) + "\n" == text  # NaN != NaN: compare the text
    data = json.loads(text)
    row = data["methods"]["strong"]
    # the row's flattened groups: Δm% and the mean rank under results.json's own keys
    assert [k for k in row if k.startswith(("delta_m", "mean_rank"))] == [
        "delta_m", "delta_m_std", "delta_m_per_seed", "delta_m_interval", "mean_rank", "mean_rank_interval"]
    assert list(row).index("delta_task") == list(row).index("delta_m_interval") + 1
    assert row["delta_m"] == summary.methods["strong"].delta_m.mean
    del data["methods"]["strong"]["hypervolume_interval"]
    with pytest.raises(DataError, match="lacks 'hypervolume_interval'"):
        from_json(Summary, data)


def test_a_method_outside_the_method_set_has_no_mean_rank_keys():
    result = jobs.summarise(all_runs(), references(), method_set=["ls", "strong"], paper_references=False)
    assert result.methods["noisy"].mean_rank is None
    assert "mean_rank" not in to_json(result)["methods"]["noisy"]
    assert "mean_rank_interval" in to_json(result)["methods"]["ls"]


def test_the_committed_demo_results_read_back_to_the_same_json():
    committed = json.loads((REPO_ROOT / "docs" / "results" / "demo.json").read_text())
    assert to_json(from_json(Summary, committed)) == committed


def test_each_evaluation_file_is_read_once(tmp_path, monkeypatch):
    runs = [write_run(tmp_path, m, s) for m in ("ls", "strong") for s in range(2)]
    reads: list[Path] = []
    original_json, original_examples = loading.atomic.read_json, loading.read_examples
    monkeypatch.setattr(loading.atomic, "read_json", lambda path, what: reads.append(Path(path)) or
                        original_json(path, what))
    monkeypatch.setattr(loading, "read_examples", lambda path: reads.append(Path(path)) or original_examples(path))
    result = jobs.summarise(runs, [], paper_references=False)
    assert result.methods["strong"].versus["ls"].paired.available
    assert len(reads) == 2 * len(runs) and len(set(reads)) == len(reads)  # a JSON and its npz, once each


def test_a_train_call_reads_the_manifest_once_and_checks_its_output_once(tmp_path, monkeypatch):
    from mtlflow.benchmarks import base
    from mtlflow.core import outputs

    jobs.prepare("toy", tmp_path / "data")
    manifests, checks = [], []
    read_manifest, check_output_dir = base.read_manifest, outputs.check_output_dir
    def counted(data_dir):
        manifests.append(data_dir)
        return read_manifest(data_dir)

    monkeypatch.setattr(base, "read_manifest", counted)
    monkeypatch.setattr(jobs, "read_manifest", counted)
    def checked(*args, **kwargs):
        checks.append(args)
        return check_output_dir(*args, **kwargs)

    monkeypatch.setattr(outputs, "check_output_dir", checked)
    monkeypatch.setattr(jobs, "check_output_dir", checked)  # mtlflow.jobs imports it at module level
    jobs.train(tmp_path / "data", tmp_path / "run", method="ls", epochs=1, progress=False, max_steps_per_epoch=1)
    assert len(manifests) == 1
    # train checks --out once, against its inputs; the run-directory guard resolves the path again when it locks it
    assert [len(c) for c in checks] == [3, 2] and checks[0][2] == [("--data", tmp_path / "data")]
    assert (tmp_path / "run" / "metrics.json").is_file()
