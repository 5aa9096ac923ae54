"""tools/mutation.py keeps mutmut's verdicts across fresh clones: what `save` writes, `restore` gives back
to a new mutants/ folder, never over a newer verdict or into mutants generated from other code."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[3] / "tools" / "mutation.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("mutation_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_meta(mutants: Path, source: str, hashes: dict, codes: dict) -> Path:
    path = mutants / (source + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes, "hash_by_function_name": hashes,
                                "type_check_error_by_key": {}, "durations_by_key": {},
                                "estimated_durations_by_key": {}}))
    return path


def test_saved_verdicts_come_back_only_where_none_is_newer_and_the_code_is_the_same(tmp_path: Path) -> None:
    tool = load_tool()
    front, simplex = "src/mtlflow/pareto/front.py", "src/mtlflow/pareto/simplex.py"
    old = tmp_path / "old"
    write_meta(old, front, {"x_dominates": "aaa"},
               {"mtlflow.pareto.front.x_dominates__mutmut_1": 1, "mtlflow.pareto.front.x_dominates__mutmut_2": 0,
                "mtlflow.pareto.front.x_dominates__mutmut_3": None})
    write_meta(old, simplex, {"x_grid_size": "bbb"}, {"mtlflow.pareto.simplex.x_grid_size__mutmut_1": 1})
    write_meta(old, "src/mtlflow/jobs/train.py", {"x_f": "c"}, {"mtlflow.jobs.train.x_f__mutmut_1": 1})  # not judged
    saved = tmp_path / "results.json"
    assert tool.save_results(old, saved) == 3  # the unchecked mutant and the file outside the folders are not saved
    assert set(json.loads(saved.read_text())["files"]) == {front, simplex}

    new = tmp_path / "new"
    # front: a newer verdict of this clone stays; simplex: generated from changed code, its results stand
    write_meta(new, front, {"x_dominates": "aaa"}, {"mtlflow.pareto.front.x_dominates__mutmut_2": 1})
    write_meta(new, simplex, {"x_grid_size": "changed"}, {})
    mutant_file = new / front
    mutant_file.write_text("# generated\n")
    assert tool.restore_results(new, saved) == 1
    restored = json.loads((new / (front + ".meta")).read_text())["exit_code_by_key"]
    assert restored == {"mtlflow.pareto.front.x_dominates__mutmut_1": 1, "mtlflow.pareto.front.x_dominates__mutmut_2": 1}
    assert json.loads((new / (simplex + ".meta")).read_text())["exit_code_by_key"] == {}
    assert os.path.getmtime(mutant_file) == 0  # older than its source: mutmut regenerates it and merges

    fresh = tmp_path / "fresh"  # a fresh clone: no mutants/ yet
    assert tool.restore_results(fresh, saved) == 3
    assert json.loads((fresh / (simplex + ".meta")).read_text())["hash_by_function_name"] == {"x_grid_size": "bbb"}


def test_retrying_forgets_only_the_asked_statuses_in_the_asked_folders(tmp_path: Path) -> None:
    # mutmut names the statuses; it is installed by `make mutation` (requirements-mutation.txt), not by `make test`
    pytest.importorskip("mutmut.stats", reason="mutmut is not installed: `make mutation` installs it")
    tool = load_tool()
    front, scoring = "src/mtlflow/pareto/front.py", "src/mtlflow/metrics/scoring.py"
    # exit codes as mutmut reads them: 1 killed, 0 survived, 33 no tests, 36 and -24 timeouts (-24: SIGXCPU)
    codes = {"m_killed": 1, "m_survived": 0, "m_no_tests": 33, "m_timeout": 36, "m_sigxcpu": -24, "m_unchecked": None}
    write_meta(tmp_path, front, {"x_f": "a"}, dict(codes))
    write_meta(tmp_path, scoring, {"x_g": "b"}, dict(codes))

    def left(source: str) -> dict:
        return json.loads((tmp_path / (source + ".meta")).read_text())["exit_code_by_key"]

    assert sorted(tool.forget(tmp_path, ["pareto"], {"timeout"})) == ["m_sigxcpu", "m_timeout"]
    assert left(front) == {**codes, "m_timeout": None, "m_sigxcpu": None}
    assert left(scoring) == codes  # another folder: untouched
    assert sorted(tool.forget(tmp_path, ["pareto", "scoring"], tool.UNDETECTED)) == ["m_no_tests", "m_no_tests",
                                                                               "m_survived", "m_survived"]
    assert left(front) == {**codes, "m_timeout": None, "m_sigxcpu": None, "m_survived": None, "m_no_tests": None}
    assert left(scoring) == {**codes, "m_survived": None, "m_no_tests": None}


def test_a_sample_is_a_seeded_uniform_draw_without_replacement() -> None:
    tool = load_tool()
    names = [f"m{i}" for i in range(10)]
    drawn = tool.sample_pending(list(reversed(names)), 3)
    assert drawn == tool.sample_pending(names, 3)  # the draw depends on the names, not their order
    assert len(set(drawn)) == 3 and set(drawn) <= set(names)
    assert tool.sample_pending(names, 10) == names and tool.sample_pending(names[:2], 5) == names[:2]
    # uniform: over 3,000 seeds each name is drawn 900 times in expectation (sd ≈ 25)
    counts = {name: 0 for name in names}
    for seed in range(3000):
        for name in tool.sample_pending(names, 3, seed):
            counts[name] += 1
    assert all(abs(count - 900) < 125 for count in counts.values()), counts


def test_the_interval_is_wilson_s_score_interval() -> None:
    tool = load_tool()
    # 8 of 10 detected: the textbook 95 % Wilson interval is 0.4902 to 0.9433
    low, high = tool.wilson_interval(8, 10)
    assert abs(low - 49.02) < 0.01 and abs(high - 94.33) < 0.01
    # its ends solve |p̂ - p| = z √(p (1 - p) / n) for p, checked against the quadratic's roots directly
    z, detected, judged = 1.96, 141, 150
    p_hat = detected / judged
    a, b, c = 1 + z * z / judged, -(2 * p_hat + z * z / judged), p_hat * p_hat
    roots = sorted(((-b - s * (b * b - 4 * a * c) ** 0.5) / (2 * a)) for s in (1, -1))
    assert all(abs(x - 100 * r) < 1e-9 for x, r in zip(tool.wilson_interval(detected, judged), roots, strict=True))
    assert tool.wilson_interval(0, 0) == (0.0, 100.0) and tool.wilson_interval(5, 5)[1] == 100.0


def test_retesting_named_mutants_forgets_exactly_those_whatever_their_verdict(tmp_path: Path) -> None:
    tool = load_tool()
    front, scoring = "src/mtlflow/pareto/front.py", "src/mtlflow/metrics/scoring.py"
    write_meta(tmp_path, front, {"x_f": "a"}, {"f_1": 0, "f_2": 1, "f_3": 0})
    write_meta(tmp_path, scoring, {"x_g": "b"}, {"g_1": 36, "g_2": 0})
    assert sorted(tool.forget_named(tmp_path, {"f_1", "f_2", "g_1", "unknown"})) == ["f_1", "f_2", "g_1"]
    assert json.loads((tmp_path / (front + ".meta")).read_text())["exit_code_by_key"] == \
        {"f_1": None, "f_2": None, "f_3": 0}
    assert json.loads((tmp_path / (scoring + ".meta")).read_text())["exit_code_by_key"] == {"g_1": None, "g_2": 0}


def test_retest_refuses_what_is_not_a_mutant_name_in_one_line(monkeypatch, capsys) -> None:
    tool = load_tool()
    monkeypatch.chdir(TOOL.parents[1])
    assert tool.main(["run", "--retest", "mtlflow.pareto.front.x_dominates__mutmut_3,x_dominates"]) == 2
    assert capsys.readouterr().err == ("error: --retest takes mutant names such as "
                                       "mtlflow.pareto.front.x_dominates__mutmut_3, got x_dominates\n")


def test_the_survivor_page_shows_each_change_with_its_reason_and_names_the_unread(tmp_path: Path) -> None:
    tool = load_tool()
    diff = ("--- src/mtlflow/pareto/front.py\n+++ src/mtlflow/pareto/front.py\n@@ -1,2 +1,2 @@\n"
            " def dominates(a, b):\n-    return a <= b\n+    return a < b\n")
    survivors = {"pareto": [("mtlflow.pareto.front.x_dominates__mutmut_1", diff),
                            ("mtlflow.pareto.front.x_dominates__mutmut_2", diff)], "scoring": []}
    page = tmp_path / "survivors.md"
    missing = tool.write_survivor_page(survivors, {"mtlflow.pareto.front.x_dominates__mutmut_1": "equal rows never reach it"},
                                       page)
    assert missing == ["mtlflow.pareto.front.x_dominates__mutmut_2"]
    text = page.read_text()
    assert "## pareto (2)" in text and "## scoring (0)" in text
    assert "- `mtlflow.pareto.front.x_dominates__mutmut_1`: equal rows never reach it\n\n    ```diff\n" \
           "    -    return a <= b\n    +    return a < b\n    ```" in text
    assert "- `mtlflow.pareto.front.x_dominates__mutmut_2`: **not read yet**" in text
    assert "+++" not in text and not list(tmp_path.glob("*.tmp"))
