"""QM9 from the real qm9pack data: graphs in PyG's QM9 format, units of the standard benchmark, the
saved split, the MPNN, and the CPU configuration trained through jobs, the CLI and the pipeline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import realdata
from mtlflow import cli, jobs
from mtlflow.benchmarks._molgraphs import parse_number_list, qm9_graph_from_xyz
from mtlflow.benchmarks.qm9 import PAPER_STL_MAE, PAPER_TARGETS, qm9pack_dir

#: A CPU configuration small enough for the test suite (a few hundred real molecules).
TINY = {"n_molecules": 400, "n_val": 50, "n_test": 50}
TINY_TRAIN = {"batch_size": 16, "max_steps_per_epoch": 2, "progress": False}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def qm9_data(tmp_path_factory) -> Path:
    if importlib.util.find_spec("qm9pack") is None:
        pytest.skip("qm9pack is not installed")
    out = tmp_path_factory.mktemp("qm9") / "data"
    jobs.prepare("qm9", out, **TINY)
    return out


@pytest.fixture(scope="module")
def qm9_rows():
    import pandas as pd

    if importlib.util.find_spec("qm9pack") is None:
        pytest.skip("qm9pack is not installed")
    return pd.read_csv(qm9pack_dir() / "qm9_part1.csv", nrows=3000)


def graph_of(row, features: str = "pyg"):
    elements = row["Elements"].strip("[]").replace("'", "").split(",")
    return qm9_graph_from_xyz(row["SMILES"], elements, parse_number_list(row["XYZ_Ang"]).reshape(-1, 3), features)


def test_graphs_have_pyg_qm9_node_and_edge_features(qm9_rows) -> None:
    methane = qm9_rows.iloc[0]
    g = graph_of(methane)
    assert methane["SMILES"] == "C" and g.x.shape == (5, 11)
    carbon = [0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 4]  # one-hot C, Z = 6, aromatic/sp/sp2/sp3 = 0 (PyG), 4 bonded H
    hydrogen = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert g.x[0].tolist() == carbon and all(row.tolist() == hydrogen for row in g.x[1:])
    assert sorted(map(tuple, g.bonds.tolist())) == [(0, 1), (0, 2), (0, 3), (0, 4)] and set(g.bond_attr) == {0}
    assert np.allclose(g.pos[0], [-0.0126981359, 1.0858041578, 0.0080009958], atol=1e-6)
    # an aromatic ring: Kekulé single/double bonds with PyG's features; aromatic bonds, sp2 with "full"
    from rdkit import Chem

    row = next(r for _, r in qm9_rows.iterrows()
               if any(a.GetIsAromatic() for a in Chem.MolFromSmiles(r["SMILES"]).GetAtoms()))
    pyg, full = graph_of(row, "pyg"), graph_of(row, "full")
    assert 3 not in set(pyg.bond_attr) and {0, 1} <= set(pyg.bond_attr) and pyg.x[:, 6:10].sum() == 0
    assert 3 in set(full.bond_attr) and full.x[:, 6].sum() > 0 and full.x[:, 8].sum() > 0
    assert np.array_equal(pyg.bonds, full.bonds)


def test_strained_cages_keep_the_smiles_bonds(qm9_rows) -> None:
    # bicyclo[1.1.1]pentane: its bridgehead carbons are close enough to look bonded by covalent radii
    row = qm9_rows[qm9_rows["SMILES"] == "C1C2CC1C2"].iloc[0]
    g = graph_of(row)
    assert not g.geometry_only and len(g.bonds) == 6 + 8  # 6 C-C ring bonds + 8 C-H
    carbons = np.flatnonzero(g.x[:, 1])
    lengths = np.linalg.norm(g.pos[g.bonds[:, 0]] - g.pos[g.bonds[:, 1]], axis=1)
    assert lengths.max() < 1.7 and len(carbons) == 5


def test_targets_are_in_the_papers_units(qm9_data: Path) -> None:
    """Our qm9pack-derived targets agree with MoleculeNet's QM9 values (realdata) for the same molecules,
    matched on their dipole moment and polarisability (the units both files share)."""
    import pandas as pd

    from mtlflow.benchmarks.qm9 import HARTREE_TO_EV, KCAL_PER_MOL_TO_EV

    path = realdata("qm9", "aimnet_qm9_val.csv")
    reference = pd.concat([pd.read_csv(path), pd.read_csv(path.with_name("aimnet_qm9_test.csv"))])
    keys = list(zip(reference["mu"].round(4), reference["alpha"].round(2), strict=True))
    unique = {k for k, n in pd.Series(keys).value_counts().items() if n == 1}
    reference = {k: row for k, row in zip(keys, reference.to_dict("records"), strict=True) if k in unique}
    store = torch.load(qm9_data / "graphs.pt", weights_only=True)
    names = store["target_names"]
    matched = 0
    for values in store["y"].tolist():
        ours = dict(zip(names, values, strict=True))
        key = (round(ours["mu"], 4), round(ours["alpha"], 2))
        if key not in reference:
            continue
        ref = reference[key]
        matched += 1
        assert ours["homo"] == pytest.approx(ref["homo"] * HARTREE_TO_EV * 1000, abs=0.5)  # meV
        assert ours["lumo"] == pytest.approx(ref["lumo"] * HARTREE_TO_EV * 1000, abs=0.5)
        assert ours["zpve"] == pytest.approx(ref["zpve"] * HARTREE_TO_EV * 1000, abs=0.5)
        assert (ours["r2"], ours["cv"]) == (pytest.approx(ref["r2"], abs=1e-3), pytest.approx(ref["cv"], abs=1e-3))
        for ours_name, ref_name in (("u0", "u0_atom"), ("u", "u298_atom"), ("h", "h298_atom"), ("g", "g298_atom")):
            # atomisation energies (meV), the MoleculeNet columns are kcal/mol
            assert ours[ours_name] == pytest.approx(ref[ref_name] * KCAL_PER_MOL_TO_EV * 1000, rel=2e-4)
    assert matched >= 10


def test_split_is_saved_seeded_and_the_data_hash_is_reproducible(qm9_data: Path, tmp_path: Path) -> None:
    split = json.loads((qm9_data / "split.json").read_text())
    assert split["seed"] == 0 and [len(split[s]) for s in ("train", "val", "test")] == [300, 50, 50]
    assert len(set(split["train"]) | set(split["val"]) | set(split["test"])) == 400
    stats = json.loads((qm9_data / "targets.json").read_text())
    assert stats["units"]["homo"] == "meV" and stats["train_std"]["homo"] > 100
    manifest = json.loads((qm9_data / "manifest.json").read_text())
    again = jobs.prepare("qm9", tmp_path / "again", **TINY)
    assert again["content_hash"] == manifest["content_hash"]
    # reusing the split file gives the same molecules in the same splits
    reuse = jobs.prepare("qm9", tmp_path / "reuse", split_file=str(qm9_data / "split.json"))
    assert json.loads((tmp_path / "reuse" / "split.json").read_text())["test"] == split["test"]
    assert reuse["molecules"] == 400


def test_items_are_complete_graphs_with_bond_and_distance_attributes(qm9_data: Path) -> None:
    bench, data = jobs.load_prepared(qm9_data)
    item = data.splits["train"][0]
    n = item.num_nodes
    assert item.x.shape == (n, 11) and item.edge_index.shape == (2, n * (n - 1)) and item.edge_attr.shape[1] == 5
    src, dst = item.edge_index
    assert bool((src != dst).all())
    assert torch.allclose(item.edge_attr[:, 4], (item.pos[dst] - item.pos[src]).norm(dim=1))
    bonded = item.edge_attr[:, :4].sum(dim=1) == 1
    store, row = data.splits["train"].store, int(item.idx)
    assert int(bonded.sum()) == 2 * int(store["bond_ptr"][row + 1] - store["bond_ptr"][row])
    assert float(item.edge_attr[bonded, 4].max()) < 1.8  # bonds are short, other pairs carry only the distance
    assert item.y.shape == (1, 11, 2)  # (standardised value, training std) per target


def test_mpnn_computes_pyg_nnconv_with_the_edge_network_once(qm9_data: Path) -> None:
    from torch_geometric.nn import NNConv

    bench, data = jobs.load_prepared(qm9_data)
    model = bench.make_model()
    trunk = model.trunk
    reference = NNConv(64, 64, trunk.edge_network, aggr="mean")
    reference.load_state_dict({k: v for k, v in trunk.conv.state_dict().items()}, strict=False)
    batch = next(iter(bench.make_loader(data.splits["train"], 8)))
    out = torch.relu(trunk.node_encoder(batch.x))
    hidden = out.unsqueeze(0)
    for _ in range(3):
        message = torch.relu(reference(out, batch.edge_index, batch.edge_attr))
        out, hidden = trunk.gru(message.unsqueeze(0), hidden)
        out = out.squeeze(0)
    expected = torch.relu(trunk.project(trunk.readout(out, batch.batch)))
    assert torch.allclose(trunk(batch), expected, atol=1e-5)
    assert sum(p.numel() for p in model.shared_parameters()) == 616_960


def test_cpu_config_trains_through_jobs_cli_and_aggregate(qm9_data: Path, tmp_path: Path, capsys) -> None:
    ls = jobs.train(qm9_data, tmp_path / "ls", method="ls", epochs=1, **TINY_TRAIN)
    metrics = json.loads((tmp_path / "ls" / "metrics.json").read_text())
    assert set(ls["final"]["test"]) == set(PAPER_TARGETS)
    assert all(e["lr"] == 1e-3 and "scheduler_monitor" in e for e in metrics["epochs"])  # plateau on val Δm
    # a DataLoader worker process (torch_geometric collation) changes nothing: same seed, same weights
    jobs.train(qm9_data, tmp_path / "ls-worker", method="ls", epochs=1, num_workers=1, **TINY_TRAIN)
    state = torch.load(tmp_path / "ls" / "model.pt", weights_only=False)["state_dict"]
    state_worker = torch.load(tmp_path / "ls-worker" / "model.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(state[k], state_worker[k]) for k in state)
    rc = cli.main(["train", "--data", str(qm9_data), "--method", "fairgrad", "--epochs", "1", "--batch-size", "16",
                   "--max-steps-per-epoch", "1", "--no-progress", "--out", str(tmp_path / "fairgrad")])
    assert rc == 0
    jobs.train(qm9_data, tmp_path / "stl-homo", method="ls", tasks=["homo"], epochs=1, **TINY_TRAIN)
    summary = jobs.aggregate([tmp_path / "ls", tmp_path / "fairgrad"], tmp_path / "report",
                             reference_dirs=[tmp_path / "stl-homo"])
    assert summary.paper_references.label == "paper STL"
    row = summary.methods["ls"]
    final = ls["final"]["test"]
    expected = 100 * np.mean([(final[t]["mae"] - PAPER_STL_MAE[t]) / PAPER_STL_MAE[t] for t in PAPER_TARGETS])
    assert row.delta_m_paper.mean == pytest.approx(expected)
    assert row.delta_m.mean == pytest.approx(100 * (final["homo"]["mae"] - summary.references.metrics["homo"]["mae"])
                                             / summary.references.metrics["homo"]["mae"])
    table = (tmp_path / "report" / "results.md").read_text()
    assert "Δm% (own STL)" in table and "Δm% (paper STL)" in table
    off = jobs.summarise([jobs.read_run(tmp_path / "ls")], [], paper_references=False)
    assert off.paper_references is None and off.methods["ls"].delta_m_paper is None
    capsys.readouterr()
    assert cli.main(["train", "--data", str(qm9_data), "--method", "fairgrad", "--batch-size", "8", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "617,675 total" in printed and "jacobian" in printed and '"scheduler": "plateau"' in printed


def test_realdata_smiles_source_builds_conformer_graphs(tmp_path: Path) -> None:
    import pandas as pd

    from mtlflow.benchmarks.qm9 import HARTREE_TO_EV

    path = realdata("qm9", "aimnet_qm9_val.csv")
    manifest = jobs.prepare("qm9", tmp_path / "aimnet", source="realdata-aimnet", n_molecules=40, n_val=5, n_test=5)
    assert manifest["source"]["geometry"].startswith("ETKDG")
    store = torch.load(tmp_path / "aimnet" / "graphs.pt", weights_only=True)
    csv = pd.read_csv(path)
    first = int(store["ids"][0])  # ids index the concatenated val + test files; the first ones are in val
    homo = dict(zip(store["target_names"], store["y"][0].tolist(), strict=True))["homo"]
    assert homo == pytest.approx(csv["homo"].iloc[first] * HARTREE_TO_EV * 1000)
    assert store["pos"].abs().sum() > 0 and store["x"].shape[1] == 11


@pytest.mark.slow
def test_qm9_runs_through_the_local_pipeline(tmp_path: Path) -> None:
    from mtlflow.pipelines import runner

    params = {"benchmark": "qm9", "data_options": {**TINY, "targets": ["homo"]}, "methods": ["ls"],
              "seeds": [0], "epochs": 1, "reference_seeds": [0],
              "train_options": {"batch_size": 16, "max_steps_per_epoch": 1, "device": "auto"}}
    report = runner.run_local(params, workdir=tmp_path)
    summary = json.loads((tmp_path / "results" / "results.json").read_text())
    assert summary["benchmark"] == "qm9" and set(summary["methods"]) == {"ls"}
    assert "delta_m" in summary["methods"]["ls"] and "delta_m_paper" in summary["methods"]["ls"]
    assert "paper STL" in report.read_text()
