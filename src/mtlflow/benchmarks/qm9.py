"""QM9: 11 molecular-property regression tasks on the full 130,831-molecule set (MTL's QM9 benchmark).

Setting of Nash-MTL, FAMO, FairGrad and COST (methods-cost.md §3): targets μ, α, HOMO, LUMO, ⟨R²⟩,
ZPVE, U0, U, H, G, c_v (PyG QM9 targets [0, 1, 2, 3, 5, 6, 12, 13, 14, 15, 11]; U0..G are
atomisation energies); complete graphs with the bond one-hot and the interatomic distance as edge
attributes (``Complete()`` + ``Distance(norm=False)``); the MPNN of :mod:`mtlflow.models.mpnn`;
MSE on standardised targets (``--scale-y True``, train statistics); MAE in the papers' units (meV for
HOMO, LUMO, ZPVE, U0, U, H, G -- PyG's eV x 1000); Adam 1e-3, ReduceLROnPlateau on validation Δm
(factor 0.7, patience 5, min lr 1e-5), batch 120, 300 epochs. Split: a seeded shuffle, then 10k test,
10k validation, the rest training, saved in ``split.json``.

Sources (option ``source``):

* ``qm9pack`` (default): the full QM9 release inside the ``qm9pack`` package (SMILES, DFT xyz
  coordinates and properties of 130,831 molecules, the same set as ``torch_geometric.datasets.QM9``).
  The package is never imported (it fails on current setuptools); its CSV files are read by path.
  Graphs: atoms in xyz order with the DFT positions; bonds from the SMILES mapped onto the geometry
  (:func:`mtlflow.benchmarks._molgraphs.qm9_graph_from_xyz`); node/edge features in PyG's QM9 format.
* ``realdata-aimnet``: the QM9 SMILES subsets in ``shared/realdata/qm9`` (26,777 molecules with
  MoleculeNet targets) -- graphs from SMILES with an ETKDG conformer instead of the DFT geometry.

Unit conversions follow PyG's QM9: Hartree -> eV with 27.211386246, kcal/mol -> eV with 0.04336414,
and the atomisation energy is the total energy minus the free-atom energies of QM9's atomref table.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from mtlflow.benchmarks._graphs import (
    GraphBenchmark,
    GraphDataset,
    load_graph_data,
    pack_graphs,
    random_split_ids,
    read_split,
    save_graph_data,
    standardised_targets,
    training_statistics,
)
from mtlflow.benchmarks._molgraphs import (
    QM9_NODE_FEATURES,
    parse_number_list,
    qm9_graph_from_smiles,
    qm9_graph_from_xyz,
)
from mtlflow.benchmarks._molnet import verify_realdata_file
from mtlflow.benchmarks.base import ConfigField, PublishedReferences
from mtlflow.benchmarks.realdata import realdata_path
from mtlflow.core.errors import DataError
from mtlflow.core.hparams import one_of
from mtlflow.metrics.regression import MAE, standardised_mse
from mtlflow.metrics.task import TaskSpec
from mtlflow.models.base import MultiTaskModel
from mtlflow.models.mpnn import MPNNTrunk, regression_heads

HARTREE_TO_EV = 27.211386246
KCAL_PER_MOL_TO_EV = 0.04336414
#: Free-atom energies (eV) of QM9's atomref table (B3LYP/6-31G(2df,p)), as in PyG's ``QM9.atomref``.
ATOMREF_EV = {
    "u0": {"H": -13.61312172, "C": -1029.86312267, "N": -1485.30251237, "O": -2042.61123593, "F": -2713.48485589},
    "u": {"H": -13.5745904, "C": -1029.82456413, "N": -1485.26398105, "O": -2042.5727046, "F": -2713.44632457},
    "h": {"H": -13.54887564, "C": -1029.79887659, "N": -1485.2382935, "O": -2042.54701705, "F": -2713.42063702},
    "g": {"H": -13.90303183, "C": -1030.25891228, "N": -1485.71166277, "O": -2043.01812778, "F": -2713.88796536},
}

#: name -> (unit, qm9pack column, aimnet column). Energies in meV, as the papers report them.
_TARGET_TABLE = """
name   unit       qm9pack column               aimnet column
mu     D          Dipole_debye                 mu
alpha  a0^3       Polarizability_bohr3         alpha
homo   meV        HOMO_au                      homo
lumo   meV        LUMO_au                      lumo
gap    meV        HOMO_LUMO_gap_au             gap
r2     a0^2       R2_bohr2                     r2
zpve   meV        ZPVE_au                      zpve
u0     meV        InternalEnergy_0K_au         u0_atom
u      meV        InternalEnergy_298K_au       u298_atom
h      meV        Enthalphy_298K_au            h298_atom
g      meV        GibbsFreeEnergy_298K_au      g298_atom
cv     cal/mol/K  Heatcapacity_Cv_cal_mol_K    cv
"""
TARGETS: dict[str, tuple[str, str, str]] = {
    name: (unit, pack, aimnet) for name, unit, pack, aimnet in (line.split() for line in _TARGET_TABLE.splitlines()[2:])
}
#: The 11 targets of the MTL papers, in their order (PyG indices [0, 1, 2, 3, 5, 6, 12, 13, 14, 15, 11]).
PAPER_TARGETS = ("mu", "alpha", "homo", "lumo", "r2", "zpve", "u0", "u", "h", "g", "cv")
#: Single-task MAEs hard-coded as ``BASE`` in the Nash-MTL/FAMO/FairGrad/COST QM9 code (methods-cost.md §3.2).
PAPER_STL_MAE = dict(zip(PAPER_TARGETS, (0.0671, 0.1814, 60.576, 53.915, 0.5027, 4.539, 58.838, 64.244, 63.852,
                                         66.223, 0.07212), strict=True))
#: Hypervolume reference point: 10x the single-task MAE (the gap, not in the papers, gets HOMO's).
HV_REFERENCE = {t: 10.0 * PAPER_STL_MAE.get(t, PAPER_STL_MAE["homo"]) for t in TARGETS}
QM9PACK_FILES = ("qm9_part1.csv", "qm9_part2.csv", "qm9_part3.csv")
AIMNET_FILES = ("aimnet_qm9_val.csv", "aimnet_qm9_test.csv")
SOURCES = ("qm9pack", "realdata-aimnet")
FEATURES = ("pyg", "full")
FIX = "re-run `mtlflow prepare --benchmark qm9`"


def _optional_positive_int(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _non_negative_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _target_list(v: Any) -> bool:
    return v is None or (isinstance(v, (list, tuple)) and len(v) > 0 and len(set(v)) == len(v)
                         and all(t in TARGETS for t in v))


def qm9pack_dir() -> Path:
    """The data folder of the installed ``qm9pack`` (located without importing the package)."""
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the qm9pack package is not installed; `pip install qm9pack==1.0.3` or pass "
                        "--data-option qm9_dir=FOLDER holding qm9_part1.csv..qm9_part3.csv")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def hartree_columns_to_units(frame, elements: Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Every target of :data:`TARGETS` from qm9pack's columns, in the benchmark's units."""
    out: dict[str, np.ndarray] = {}
    for name, (unit, column, _) in TARGETS.items():
        values = frame[column].to_numpy(dtype=np.float64)
        if name in ATOMREF_EV:
            refs = ATOMREF_EV[name]
            free_atoms = np.array([sum(refs[e] for e in atoms) for atoms in elements])
            values = values * HARTREE_TO_EV - free_atoms
            values = values * 1000.0
        elif unit == "meV":
            values = values * HARTREE_TO_EV * 1000.0
        out[name] = values
    return out


def aimnet_columns_to_units(frame) -> dict[str, np.ndarray]:
    """Every target from MoleculeNet-unit columns (Hartree; ``*_atom`` in kcal/mol)."""
    out: dict[str, np.ndarray] = {}
    for name, (unit, _, column) in TARGETS.items():
        values = frame[column].to_numpy(dtype=np.float64)
        if name in ATOMREF_EV:
            values = values * KCAL_PER_MOL_TO_EV * 1000.0
        elif unit == "meV":
            values = values * HARTREE_TO_EV * 1000.0
        out[name] = values
    return out


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


class QM9(GraphBenchmark):
    name = "qm9"
    description = ("QM9 (130,831 molecules, DFT geometries from qm9pack): 11 property regressions with the "
                   "MPNN of Nash-MTL/FAMO/FairGrad/COST; MAE in the papers' units")
    config_fields = {
        "source": ConfigField("qm9pack", "qm9pack (full QM9 with DFT xyz) or realdata-aimnet (SMILES subsets in "
                              "shared/realdata/qm9, ETKDG conformers)", one_of(*SOURCES)),
        "qm9_dir": ConfigField(None, "folder with qm9pack's qm9_part{1,2,3}.csv (default: the installed package)",
                               lambda v: v is None or isinstance(v, str), "a folder path"),
        "n_molecules": ConfigField(None, "use this many molecules (seeded subset; default all)",
                                   _optional_positive_int, "a positive integer or null"),
        "n_val": ConfigField(10_000, "validation molecules", _non_negative_int, "an integer >= 0"),
        "n_test": ConfigField(10_000, "test molecules", _non_negative_int, "an integer >= 0"),
        "seed": ConfigField(0, "seed of the shuffle that makes the split (recorded in split.json)",
                            lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        "targets": ConfigField(None, "subset of targets (default the papers' 11: " + ", ".join(PAPER_TARGETS) + ")",
                               _target_list, "a list of distinct names from " + ", ".join(TARGETS)),
        "features": ConfigField("pyg", "pyg (PyG's QM9 processing: aromatic/hybridisation columns 0, Kekulé "
                                "bonds, as the papers trained) or full (sanitised RDKit features)",
                                one_of(*FEATURES)),
        "split_file": ConfigField(None, "reuse the molecule ids of this split.json instead of a new shuffle",
                                  lambda v: v is None or isinstance(v, str), "a file path"),
    }
    # evaluation batches of 120 too: the edge network's output (E x 4096 floats) dominates memory
    train_defaults = {"epochs": 300, "batch_size": 120, "eval_batch_size": 120, "lr": 1e-3, "optimizer": "adam",
                      "scheduler": "plateau",
                      "scheduler_options": {"factor": 0.7, "patience": 5, "min_lr": 1e-5, "monitor": "val_delta_m"}}
    #: A CPU smoke configuration (a few thousand molecules, a few epochs) -- used by the tests.
    cpu_smoke = {"data_options": {"n_molecules": 3000, "n_val": 500, "n_test": 500},
                 "train_options": {"epochs": 3, "batch_size": 64}}

    def method_defaults(self, method: str) -> dict[str, Any]:
        # LDC-MTL Table 5 / App. A.1 (QM9): λ = 0.05, τ = σ(W), log normalisation (l_0 per epoch), a [11, 1] vector
        if method == "ldcmtl":
            # Table 5's λ multiplies the discrepancy in the authors' code: form="code" (see methods/ldcmtl.py)
            return {"penalty": 0.05, "form": "code",
                    "tau": "sigma", "normalization": "log", "router": "vector"}
        if method == "forum":  # thesis §3.5 (MTL setup): lower-level step η = 0.01 on QM9 (0.1 elsewhere)
            return {"inner_lr": 0.01}
        return {}

    @property
    def target_names(self) -> list[str]:
        return list(self.config["targets"] or PAPER_TARGETS)

    @property
    def tasks(self) -> list[TaskSpec]:
        return [TaskSpec(name, standardised_mse, (MAE,), primary="mae", hv_reference=HV_REFERENCE[name])
                for name in self.target_names]

    def published_references(self) -> PublishedReferences:
        return PublishedReferences(
            label="paper STL",
            source="single-task MAEs hard-coded as BASE in the Nash-MTL/FAMO/FairGrad/COST QM9 code "
                   "(methods-cost.md §3.2)",
            metrics={t: {"mae": PAPER_STL_MAE[t]} for t in PAPER_TARGETS},
            note="units: D, a0^3, meV (HOMO, LUMO, ZPVE, U0, U, H, G), a0^2, cal/mol/K")

    # -- preparation -------------------------------------------------------------------------
    def write_data(self, out_dir: Path) -> dict[str, Any]:
        cfg = self.config
        started = time.perf_counter()
        if cfg["source"] == "qm9pack":
            ids, graphs, targets, source = self._read_qm9pack()
        else:
            ids, graphs, targets, source = self._read_aimnet()
        featurise_seconds = time.perf_counter() - started
        names = list(TARGETS)
        y = np.stack([targets[n] for n in names], axis=1)
        store = pack_graphs(graphs, y, ids)
        store["target_names"] = names  # type: ignore[assignment]
        split = self._split(ids)
        save_graph_data(out_dir, store, split, None if cfg["split_file"] else cfg["seed"],
                        f"from {cfg['split_file']}" if cfg["split_file"] else
                        "seeded shuffle; test = first n_test, val = next n_val, train = rest")
        stats = {"names": names, "units": {n: TARGETS[n][0] for n in names},
                 **training_statistics(store, split, names, FIX),
                 "note": "targets are standardised with these training statistics; MAE is reported in the units"}
        (out_dir / "targets.json").write_text(json.dumps(stats, indent=2) + "\n")
        return {"source": source, "molecules": len(ids), "split_sizes": {k: len(v) for k, v in split.items()},
                "geometry_only_bonds": int(sum(g.geometry_only for g in graphs)),
                "featurise_seconds": round(featurise_seconds, 1), "node_features": QM9_NODE_FEATURES,
                "edge_attributes": "bond one-hot (single, double, triple, aromatic) + distance (Å), complete graph"}

    def _selection(self, ids: Sequence[int]) -> list[int]:
        """Positions of the molecules to featurise (all, or those of the split / the subset)."""
        cfg = self.config
        if cfg["split_file"]:
            wanted = {i for ids_ in read_split(Path(cfg["split_file"]), "pass an existing split.json").values()
                      for i in ids_}
            return [p for p, i in enumerate(ids) if i in wanted]
        n = cfg["n_molecules"] or len(ids)
        if n > len(ids):
            raise DataError(f"n_molecules={n} but the {cfg['source']} source has {len(ids)} molecules")
        if cfg["n_val"] + cfg["n_test"] >= n:
            raise DataError(f"n_val + n_test = {cfg['n_val'] + cfg['n_test']} leaves no training molecules "
                            f"out of {n}; lower them or raise n_molecules")
        order = np.random.default_rng(cfg["seed"]).permutation(len(ids))
        return sorted(order[:n].tolist())

    def _split(self, ids: Sequence[int]) -> dict[str, list[int]]:
        cfg = self.config
        if cfg["split_file"]:
            return read_split(Path(cfg["split_file"]), "pass an existing split.json")
        return random_split_ids(ids, cfg["n_val"], cfg["n_test"], cfg["seed"])

    def _read_qm9pack(self):
        import pandas as pd

        folder = Path(self.config["qm9_dir"]) if self.config["qm9_dir"] else qm9pack_dir()
        paths = [folder / f for f in QM9PACK_FILES]
        for path in paths:
            if not path.is_file():
                raise DataError(f"QM9 file missing: expected {path}; install qm9pack==1.0.3 or point "
                                "--data-option qm9_dir at a folder with qm9_part1.csv..qm9_part3.csv")
        columns = ["Index", "SMILES", "Elements", "XYZ_Ang"] + sorted({c for _, c, _ in TARGETS.values()})
        try:
            frame = pd.concat([pd.read_csv(p, usecols=columns) for p in paths], ignore_index=True)
        except (ValueError, pd.errors.ParserError) as exc:
            raise DataError(f"cannot read the QM9 CSV files in {folder} ({exc}); reinstall qm9pack") from None
        all_ids = frame["Index"].astype(int).tolist()
        keep = self._selection(all_ids)
        frame = frame.iloc[keep].reset_index(drop=True)
        elements = [e.strip("[]").replace("'", "").replace(" ", "").split(",") for e in frame["Elements"]]
        graphs = []
        for smiles, atoms, xyz in zip(frame["SMILES"], elements, frame["XYZ_Ang"], strict=True):
            graphs.append(qm9_graph_from_xyz(smiles, atoms, parse_number_list(xyz).reshape(-1, 3),
                                             self.config["features"]))
        source = {"name": "qm9pack", "version": _package_version("qm9pack"), "folder": str(folder),
                  "molecules_in_source": len(all_ids), "bytes": {p.name: p.stat().st_size for p in paths}}
        return frame["Index"].astype(int).tolist(), graphs, hartree_columns_to_units(frame, elements), source

    def _read_aimnet(self):
        import pandas as pd


        paths = [realdata_path("qm9", f) for f in AIMNET_FILES]
        if any(p is None for p in paths):
            raise DataError("the real QM9 SMILES files shared/realdata/qm9/aimnet_qm9_{val,test}.csv were not "
                            "found; set MTLFLOW_REALDATA to the shared realdata folder")
        frame = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
        all_ids = list(range(len(frame)))
        keep = self._selection(all_ids)
        frame = frame.iloc[keep].reset_index(drop=True)
        graphs = [qm9_graph_from_smiles(s, self.config["features"], seed=self.config["seed"]) for s in frame["smiles"]]
        invalid = [s for s, g in zip(frame["smiles"], graphs, strict=True) if g is None]
        if invalid:
            raise DataError(f"{len(invalid)} SMILES of the realdata QM9 files could not be parsed (first: {invalid[0]}); "
                            "restore the shared realdata folder")
        source = {"name": "realdata-aimnet", "files": [str(p) for p in paths],
                  "sha256": {p.name: verify_realdata_file(p) for p in paths},
                  "geometry": "ETKDG conformer (RDKit, seeded), not the DFT geometry"}
        return keep, graphs, aimnet_columns_to_units(frame), source

    # -- loading ------------------------------------------------------------------------------
    def read_splits(self, data_dir: Path) -> dict[str, Dataset]:
        store, rows = load_graph_data(data_dir, "QM9", FIX)
        names = list(store.get("target_names", list(TARGETS)))
        missing = [t for t in self.target_names if t not in names]
        if missing:
            raise DataError(f"QM9 data in {data_dir} lacks target(s) {missing}; {FIX}")
        columns = [names.index(t) for t in self.target_names]
        targets = standardised_targets(store["y"][:, columns], rows["train"])
        return {name: GraphDataset(store, rows[name], targets, complete=True) for name in rows}

    def make_model(self, task_names: Sequence[str] | None = None) -> MultiTaskModel:
        names = [t.name for t in self.select_tasks(task_names)]
        trunk = MPNNTrunk(node_features=QM9_NODE_FEATURES, edge_features=5, dim=64)
        return MultiTaskModel(trunk, regression_heads(trunk.out_features, len(names)), names)
