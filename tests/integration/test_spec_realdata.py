"""Task specs on real tables (read from ../shared/realdata, or shipped by scikit-learn, written to temporary
files only): the docs' first-page commands end to end, a molecule table with missing labels, a multi-label
Parquet table, multi-target regression tables, training two methods and resuming, and bad input at the
command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import churn_csv, first_page_commands, realdata, run_cli, stderr_lines
from mtlflow import jobs
from mtlflow.benchmarks._tabular import read_arff

TINY = {"batch_size": 64, "max_steps_per_epoch": 3, "progress": False}


def sklearn_baselines(table: pd.DataFrame, split: np.ndarray) -> dict[str, tuple[float, float]]:
    """Per task of churn.csv, a well-tuned scikit-learn model fit on the train + val rows (standardised
    features; regularisation chosen by 5-fold cross-validation; rows without that task's label dropped) and
    scored on the test rows with the report's primary metric: (score, the change one test example can make
    to it). The second number is the comparison's tolerance: the test split's resolution."""
    import warnings

    from sklearn.linear_model import LogisticRegressionCV, RidgeCV
    from sklearn.metrics import accuracy_score, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    features = table.drop(columns=["churned", "spend", "plan"]).to_numpy(dtype=float)
    fit, test = split != 2, split == 2        # split.npy: 0 train, 1 val, 2 test
    baselines = {}
    with warnings.catch_warnings():           # scikit-learn 1.9's notes on its future defaults
        warnings.simplefilter("ignore", FutureWarning)
        labelled = table["churned"].notna().to_numpy()
        y = (table["churned"] == "yes").to_numpy()
        model = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=np.logspace(-4, 4, 17), cv=5, max_iter=5000))
        model.fit(features[fit & labelled], y[fit & labelled])
        rows = test & labelled
        # AUC: moving one positive example from the bottom to the top of the ranking changes it by 1/#positives
        baselines["churned"] = (roc_auc_score(y[rows], model.predict_proba(features[rows])[:, 1]), 1 / y[rows].sum())
        model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-4, 4, 33))).fit(
            features[fit], table["spend"][fit])
        residuals = np.abs(model.predict(features[test]) - table["spend"][test])
        baselines["spend"] = (float(residuals.mean()), float(residuals.max() / test.sum()))
        model = make_pipeline(StandardScaler(), LogisticRegressionCV(Cs=np.logspace(-4, 4, 17), cv=5, max_iter=5000))
        model.fit(features[fit], table["plan"][fit])
        baselines["plan"] = (accuracy_score(table["plan"][test], model.predict(features[test])), 1 / test.sum())
    return baselines


@pytest.mark.slow
def test_the_first_page_commands_give_a_report_comparing_methods_on_a_csv(tmp_path: Path) -> None:
    """The two commands exactly as the docs' first page prints them, with their defaults, on churn.csv: 400
    real scm20d rows, three tasks of three kinds (binary ``churned`` with 15 % of its labels missing,
    regression ``spend``, multiclass ``plan``). The report has three seeds per method and a verdict box,
    and per task its best method's 95 % interval reaches a well-tuned scikit-learn model fit and scored on the
    same rows (within the test split's resolution): the default budget trains."""
    churn_csv(tmp_path / "churn.csv")
    commands = first_page_commands()
    assert commands == ["mtlflow spec init churn.csv --tasks churned,spend,plan --out churn.yaml",
                        "mtlflow pipeline run --local --param spec=churn.yaml --workdir results"]
    for command in commands:
        proc = run_cli(*command.split()[1:], cwd=tmp_path, env={"MTLFLOW_CACHE": str(tmp_path / "cache")},
                       timeout=1500)
        assert proc.returncode == 0, proc.stderr[-3000:]
    spec = yaml.safe_load((tmp_path / "churn.yaml").read_text())
    assert spec["tasks"] == [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"},
                             {"name": "plan", "type": "multiclass"}]
    summary = json.loads((tmp_path / "results" / "results" / "results.json").read_text())
    assert summary["dataset"] == "churn" and set(summary["methods"]) == {"ls", "mgda", "famo", "fairgrad"}
    assert all(len(row["seeds"]) == 3 for row in summary["methods"].values())
    assert all(np.isfinite(row["delta_m"]) for row in summary["methods"].values())
    assert summary["primary_metrics"] == {"churned": "roc_auc", "spend": "mae", "plan": "acc"}
    assert summary["pareto_set"] and (tmp_path / "results" / "report.html").is_file()
    assert "report: " in proc.stdout
    # the verdict box opens the report and says, for each method against the best one, whether it differs
    results_md = (tmp_path / "results" / "results" / "results.md").read_text()
    verdict = results_md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    best = summary["best_method"]
    headline = verdict.strip().splitlines()[0]  # a bold winner, or first that no method is distinguishable
    assert results_md.index("## Verdict") < results_md.index("## Results") and f"{best} has the lowest" in headline
    assert headline.startswith(("**No method is distinguishable from ", f"**{best} has the lowest"))
    assert summary["best_by"] == "delta_m"
    lines = {line.split(" at 95 %")[0]: line for line in verdict.splitlines() if " at 95 % (Δm%): " in line}
    for other in sorted(set(summary["methods"]) - {best}):
        said = summary["methods"][other]["versus"]["best"]["delta_m"]["verdict"]
        group = {"worse": f"- Worse than {best}", "indistinguishable at 95 %": f"- Not shown different from {best}"}
        assert other in lines[group[said]].split(": ", 1)[1].rstrip(".").split(", "), (other, said, verdict)
    # the best method against scikit-learn, on the rows the pipeline split off
    (split_file,) = (tmp_path / "results" / "artifacts").glob("*/prepare-data/data/split.npy")
    split = np.load(split_file)
    table = pd.read_csv(tmp_path / "churn.csv")
    assert len(split) == len(table) == 400 and table["churned"].isna().sum() == 60
    for task, (baseline, resolution) in sklearn_baselines(table, split).items():
        metric = summary["primary_metrics"][task]
        interval = summary["methods"][best]["intervals"][task][metric]
        if metric == "mae":
            assert interval["low"] <= baseline + resolution, (task, interval, baseline)
        else:
            assert interval["high"] >= baseline - resolution, (task, interval, baseline)


def test_molecules_with_missing_labels_train_two_methods_and_resume(tmp_path: Path) -> None:
    tox21 = pd.read_csv(realdata("chem", "tox21.csv")).head(400)
    tox21.to_csv(tmp_path / "tox21.csv", index=False)
    assays = [c for c in tox21.columns if c != "smiles"]
    spec = {"name": "tox21-head", "source": {"table": "tox21.csv", "smiles": "smiles"},
            "tasks": [{"name": a, "type": "binary"} for a in assays], "model": {"hidden": [16]}}
    (tmp_path / "tox21.yaml").write_text(yaml.safe_dump(spec))
    manifest = jobs.prepare("spec", tmp_path / "data", spec=str(tmp_path / "tox21.yaml"))
    # every non-empty cell is a label, every empty one counts nowhere
    counts = manifest["label_counts"]
    assert manifest["invalid_smiles_skipped"] == 0
    for assay in assays:
        assert sum(counts[assay].values()) == tox21[assay].notna().sum()
    assert sum(sum(c.values()) for c in counts.values()) < tox21[assays].size  # Tox21 has missing labels
    for method in ("ls", "pcgrad"):
        result = jobs.train(tmp_path / "data", tmp_path / method, method=method, epochs=1, **TINY)
        assert all(np.isfinite(m["loss"]) for m in result["final"]["test"].values())
    resumed = jobs.train(tmp_path / "data", tmp_path / "pcgrad", method="pcgrad", epochs=2, resume=True, **TINY)
    history = json.loads((tmp_path / "pcgrad" / "metrics.json").read_text())["epochs"]
    assert len(history) == 2 and resumed["final"]["test"].keys() == set(assays)


def test_a_multilabel_parquet_table(tmp_path: Path) -> None:
    table, names = read_arff(realdata("mlc", "yeast.orig.arff.gz"))
    frame = pd.DataFrame(table, columns=names)
    labels = [n for n in names if n.startswith("Class")]
    frame[labels] = frame[labels].astype(int)
    frame.to_parquet(tmp_path / "yeast.parquet", index=False)
    spec = {"name": "yeast", "source": {"table": "yeast.parquet"},
            "tasks": [{"name": "functions_a", "type": "multilabel", "columns": labels[:7]},
                      {"name": "functions_b", "type": "multilabel", "columns": labels[7:]}],
            "split": {"seed": 1}, "model": {"hidden": [32]}}
    (tmp_path / "yeast.yaml").write_text(yaml.safe_dump(spec))
    bench = jobs.prepare("spec", tmp_path / "data", spec=str(tmp_path / "yeast.yaml"))
    assert bench["split_sizes"] == {"train": 1692, "val": 242, "test": 483}
    for method in ("upgrad", "famo"):
        result = jobs.train(tmp_path / "data", tmp_path / method, method=method, epochs=1, **TINY)
        assert set(result["final"]["test"]["functions_a"]) == {"loss", "f1", "roc_auc", "acc"}
    jobs.train(tmp_path / "data", tmp_path / "famo", method="famo", epochs=2, resume=True, **TINY)
    assert len(json.loads((tmp_path / "famo" / "metrics.json").read_text())["epochs"]) == 2


def test_a_dvc_tracked_table_is_read_at_the_requested_revision(tmp_path: Path) -> None:
    """source.repo + rev (and spec_rev, which overrides rev): the table as a git revision of a DVC repository
    holds it, through dvc.api; a new revision is new data."""
    import subprocess
    import sys

    from mtlflow.config.data import DataConfig

    repo = tmp_path / "repo"
    repo.mkdir()

    def run(*args: str) -> None:
        subprocess.run(args, cwd=repo, check=True, capture_output=True)

    run("git", "init", "-q")
    run("git", "config", "user.email", "ci@example.com")
    run("git", "config", "user.name", "ci")
    run(sys.executable, "-m", "dvc", "init", "-q")
    clintox = pd.read_csv(realdata("chem", "clintox.csv"))
    for rows, tag in ((120, "v1"), (160, "v2")):
        clintox.head(rows).to_csv(repo / "clintox.csv", index=False)
        run(sys.executable, "-m", "dvc", "add", "-q", "clintox.csv")
        run("git", "add", "-A")
        run("git", "commit", "-qm", tag)
        run("git", "tag", tag)
    spec = {"name": "clintox", "source": {"table": "clintox.csv", "repo": str(repo), "rev": "v1", "smiles": "smiles"},
            "tasks": [{"name": "FDA_APPROVED", "type": "binary"}, {"name": "CT_TOX", "type": "binary"}]}
    (tmp_path / "clintox.yaml").write_text(yaml.safe_dump(spec))
    first = jobs.prepare("spec", tmp_path / "v1", spec=str(tmp_path / "clintox.yaml"))
    assert first["source"]["rows"] == 120 and first["source"]["table"] == f"clintox.csv of {repo}@v1"
    benchmark, options = DataConfig(spec=str(tmp_path / "clintox.yaml"), spec_rev="v2").preparation()
    second = jobs.prepare(benchmark, tmp_path / "v2", **options)
    assert second["source"]["rows"] == 160 and second["content_hash"] != first["content_hash"]


def test_a_spec_file_in_a_dvc_repository_is_read_at_a_revision_with_its_table(tmp_path: Path) -> None:
    """spec = {repo, path, rev}: the spec file (git-tracked) and its table (DVC-tracked, a path relative to the
    spec) are read from a real git + DVC repository at one revision; spec_rev selects another revision of
    both. The repository is made here with git and DVC's own Repo API."""
    import subprocess

    from dvc.repo import Repo

    from mtlflow.benchmarks._spec.schema import SpecError
    from mtlflow.config.data import DataConfig

    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    (repo / "data").mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "ci@example.com")
    git("config", "user.name", "ci")
    Repo.init(str(repo))
    table, names = read_arff(realdata("mtr", "atp1d.arff"))
    frame = pd.DataFrame(table, columns=names)
    targets = names[-6:]
    for rows, tag in ((200, "v1"), (300, "v2")):
        frame.head(rows).to_csv(repo / "data" / "atp1d.csv", index=False)
        Repo(str(repo)).add(str(repo / "data" / "atp1d.csv"))
        spec = {"name": f"atp1d-{tag}", "source": {"table": "../data/atp1d.csv"},  # v2 adds a task
                "tasks": [{"name": t, "type": "regression"} for t in targets[:1 if tag == "v1" else 2]],
                "features": {"numeric": names[:-6]}}
        (repo / "specs" / "atp1d.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        git("add", "-A")
        git("commit", "-qm", tag)
        git("tag", tag)
    location = f"{{repo: {repo}, path: specs/atp1d.yaml, rev: v1}}"
    benchmark, options = DataConfig(spec=location).preparation()
    first = jobs.prepare(benchmark, tmp_path / "v1", **options)
    assert first["label"] == "atp1d-v1" and first["tasks"] == targets[:1]
    assert first["source"]["rows"] == 200 and first["source"]["table"] == f"data/atp1d.csv of {repo}@v1"
    benchmark, options = DataConfig(spec=location, spec_rev="v2").preparation()
    second = jobs.prepare(benchmark, tmp_path / "v2", **options)
    assert second["label"] == "atp1d-v2" and second["tasks"] == targets[:2]
    assert second["source"]["rows"] == 300 and second["source"]["table"] == f"data/atp1d.csv of {repo}@v2"
    with pytest.raises(SpecError, match=r"spec file specs/nothere.yaml of .*@v1 cannot be read \(.*\); check repo"):
        DataConfig(spec=location.replace("atp1d.yaml", "nothere.yaml")).build_benchmark()
    with pytest.raises(SpecError, match=r"is not a spec location \(path: is required\); give a spec file's path"):
        DataConfig(spec=f"{{repo: {repo}, rev: v1}}").build_benchmark()


def test_multi_target_regression_reports_original_units(tmp_path: Path) -> None:
    table, names = read_arff(realdata("mtr", "atp1d.arff"))
    targets = names[-6:]
    pd.DataFrame(table, columns=names).to_csv(tmp_path / "atp1d.csv", index=False)
    spec = {"name": "atp1d", "source": {"table": "atp1d.csv"},
            "tasks": [{"name": t, "type": "regression"} for t in targets],
            "features": {"numeric": names[:-6]}, "model": {"hidden": [32]}}
    (tmp_path / "atp1d.yaml").write_text(yaml.safe_dump(spec))
    jobs.prepare("spec", tmp_path / "data", spec=str(tmp_path / "atp1d.yaml"))
    result = jobs.train(tmp_path / "data", tmp_path / "run", method="imtl", epochs=1, **TINY)
    prices = pd.DataFrame(table, columns=names)[targets]
    for target in targets:  # MAE in dollars: the order of the price's spread, not of standard units
        assert 0.05 * prices[target].std() < result["final"]["test"][target]["mae"] < 5 * prices[target].std()


def test_linnerud_a_regression_table_that_scikit_learn_ships_trains_two_methods_and_resumes(tmp_path: Path) -> None:
    from sklearn.datasets import load_linnerud

    linnerud = load_linnerud(as_frame=True).frame  # 20 athletes: 3 exercises, 3 body measurements
    linnerud.to_csv(tmp_path / "linnerud.csv", index=False)
    targets = ["Weight", "Waist", "Pulse"]
    spec = {"name": "linnerud", "source": {"table": "linnerud.csv"},
            "tasks": [{"name": t, "type": "regression"} for t in targets],
            "split": {"val": 0.2, "test": 0.2, "seed": 4}, "model": {"hidden": [8]}}
    (tmp_path / "linnerud.yaml").write_text(yaml.safe_dump(spec))
    manifest = jobs.prepare("spec", tmp_path / "data", spec=str(tmp_path / "linnerud.yaml"))
    assert manifest["split_sizes"] == {"train": 12, "val": 4, "test": 4}
    schema = json.loads((tmp_path / "data" / "schema.json").read_text())
    train = linnerud[np.load(tmp_path / "data" / "split.npy") == 0]  # features and targets: training statistics
    assert schema["features"]["numeric"] == [{"name": c, "mean": pytest.approx(train[c].mean()),
                                              "std": pytest.approx(train[c].std(ddof=0)),
                                              "missing": int(linnerud[c].isna().sum())}
                                             for c in ("Chins", "Situps", "Jumps")]
    assert schema["target_statistics"]["Pulse"] == {"mean": pytest.approx(train["Pulse"].mean()),
                                                    "std": pytest.approx(train["Pulse"].std(ddof=0))}
    for method in ("ls", "cagrad"):
        result = jobs.train(tmp_path / "data", tmp_path / method, method=method, epochs=1, **TINY)
        assert set(result["final"]["test"]["Pulse"]) == {"loss", "mae", "rmse", "r2"}
    jobs.train(tmp_path / "data", tmp_path / "cagrad", method="cagrad", epochs=2, resume=True, **TINY)
    assert len(json.loads((tmp_path / "cagrad" / "metrics.json").read_text())["epochs"]) == 2


@pytest.mark.parametrize("case", ["unknown_column", "syntax", "spec_and_benchmark", "missing_spec"])
def test_bad_spec_input_is_one_line_exit_2_and_writes_nothing(case: str, tmp_path: Path) -> None:
    tox21 = pd.read_csv(realdata("chem", "tox21.csv")).head(50)
    tox21.to_csv(tmp_path / "tox21.csv", index=False)
    spec = tmp_path / "tox21.yaml"
    text = "name: t\nsource: {table: tox21.csv, smiles: smiles}\ntasks:\n  - {name: NR-AR, type: binary}\n"
    args = ["prepare", "--spec", str(spec), "--out", str(tmp_path / "out")]
    expected = ""
    if case == "unknown_column":
        text = text.replace("NR-AR", "NR-XX")
        expected = "tox21.yaml:4: tasks[0].name: column 'NR-XX' is not in the table"
    elif case == "syntax":
        text += "  - {name: SR-MMP, type: binary\n"
        expected = "tox21.yaml:6:"
    elif case == "spec_and_benchmark":
        args += ["--benchmark", "qm9"]
        expected = "--spec describes the data, so --benchmark qm9 does not apply"
    else:
        args[2] = str(tmp_path / "nothere.yaml")
        expected = "spec file not found"
    spec.write_text(text)
    proc = run_cli(*args, env={"MTLFLOW_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    lines = stderr_lines(proc)
    assert len(lines) == 1 and lines[0].startswith("mtlflow: error: ") and expected in lines[0], proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
