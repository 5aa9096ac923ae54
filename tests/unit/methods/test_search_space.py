"""The search spaces of `mtlflow tune`: every method shares the training settings' ranges (LS is tuned exactly as
hard as the rest), every method range cites its source, contains the paper default and only holds values the
hyper-parameter accepts; a params file can replace or drop a range."""

from __future__ import annotations

import json
import math

import pytest

from mtlflow import methods
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import SearchRange
from mtlflow.methods.search import SHARED_SPACE, method_space, search_space

TUNED = [n for n in methods.available() if method_space(methods.get(n))]


def range_values(r: SearchRange) -> list:
    if r.scale == "categorical":
        return list(r.choices)
    if r.scale == "int":
        return [int(r.low), int(r.high)]
    return [r.low, math.sqrt(r.low * r.high) if r.scale == "log" else (r.low + r.high) / 2, r.high]


def test_every_method_is_searched_over_the_same_shared_settings():
    for name in methods.available():
        space = search_space(methods.get(name))
        assert {k: space[k] for k in SHARED_SPACE} == SHARED_SPACE, name


def test_the_methods_with_a_paper_grid_declare_it():
    # the grids the seed papers and the tuning studies publish (shared/reference/tuning-and-gates.md)
    assert {"cagrad", "famo", "fairgrad", "forum", "moml", "palora", "ldcmtl", "gradnorm"} <= set(TUNED)
    assert search_space(methods.get("palora"))["alpha"].choices == (1.0, 2.0, 5.0, 10.0)
    assert search_space(methods.get("forum"))["inner_lr"].choices == (0.05, 0.1, 0.5)


@pytest.mark.parametrize("name", TUNED)
def test_each_range_cites_a_source_contains_the_default_and_only_valid_values(name):
    cls = methods.get(name)
    for key, r in method_space(cls).items():
        spec = cls.hparams[key]
        assert r.source, f"{name}.{key}: no source"
        if r.scale == "categorical":
            assert spec.default in r.choices, f"{name}.{key}: default {spec.default} not among {r.choices}"
        else:
            assert r.low <= spec.default <= r.high, f"{name}.{key}: default {spec.default} outside the range"
        for value in range_values(r):
            assert spec.coerce(name, key, value) == value
        methods.build(name, 2, 0, **{key: range_values(r)[-1]})


def test_a_params_file_replaces_or_drops_a_range_and_names_an_unknown_one():
    cls = methods.get("cagrad")
    space = search_space(cls, {"lr": {"scale": "log", "low": 1e-4, "high": 3e-3}, "c": None})
    assert space["lr"] == SearchRange("log", 1e-4, 3e-3, source="params file")
    assert "c" not in space
    # a hyper-parameter without a declared range may be added by the params file
    assert search_space(cls, {"rescale": {"choices": [0, 1]}})["rescale"].choices == (0, 1)
    with pytest.raises(InvalidParameterError, match="'gamma' is neither"):
        search_space(cls, {"gamma": {"choices": [1]}})


@pytest.mark.parametrize("bad, words", [
    ({"scale": "log", "low": 0.0, "high": 1.0}, "log scale needs low > 0"),
    ({"scale": "linear", "low": 2.0, "high": 1.0}, "needs low < high"),
    ({"scale": "cubic", "low": 1.0, "high": 2.0}, "scale must be one of"),
    ({"choices": []}, "at least one choice"),
    ({"scale": "categorical"}, "at least one choice"),
    ({"low": 1.0, "high": 2.0}, "give a scale"),
    ({"scale": "log", "low": 1e-4, "high": 1e-2, "step": 2}, "unknown key"),
])
def test_a_bad_range_is_one_line_naming_the_setting(bad, words):
    with pytest.raises(InvalidParameterError, match=words) as info:
        SearchRange.from_mapping("lr", bad)
    assert "search range of lr" in str(info.value) and "\n" not in str(info.value)


def test_a_range_round_trips_through_its_dict():
    for name in TUNED:
        for r in method_space(methods.get(name)).values():
            assert SearchRange.from_mapping("x", {**r.as_dict()}) == r


def test_methods_json_shows_the_space(capsys):
    from mtlflow.cli import main

    assert main(["methods", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ls"]["search"]["lr"] == SHARED_SPACE["lr"].as_dict()
    assert rows["palora"]["search"]["alpha"]["range"] == "one of {1.0, 2.0, 5.0, 10.0}"
