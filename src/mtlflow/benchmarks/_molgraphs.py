"""Molecular graphs for the chemistry benchmarks (QM9, QM8, Tox21), built with RDKit.

Two featurisations:

* **QM9 format** (:func:`qm9_graph_from_xyz`, :func:`qm9_graph_from_smiles`): the node and edge
  features of ``torch_geometric.datasets.QM9`` -- 11 node features ``[one-hot H, C, N, O, F,
  atomic number, aromatic, sp, sp2, sp3, number of bonded H]`` and a 4-way bond one-hot ``[single,
  double, triple, aromatic]`` -- with explicit hydrogens and 3-D positions.
  ``features="pyg"`` reproduces what PyG's processing of ``gdb9.sdf`` yields: it reads the SDF with
  ``sanitize=False``, so the aromatic and hybridisation columns are 0 and bonds are Kekulé
  (pyg-team/pytorch_geometric issues #2163 and #8370). The MTL papers trained on that data.
  ``features="full"`` fills those columns from the sanitised molecule (aromatic bonds included).
* **Categorical format** (:func:`categorical_graph_from_smiles`): PyG's ``from_smiles`` features
  (9 integer atom columns, 3 integer bond columns) for molecules with any element (Tox21, QM8).

Heavy imports (RDKit, torch_geometric) happen inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Element order of the one-hot block of PyG's QM9 node features.
QM9_ELEMENTS = ("H", "C", "N", "O", "F")
QM9_NODE_FEATURES = 11
#: single, double, triple, aromatic
QM9_BOND_TYPES = 4
#: Covalent-radius factors tried, in order, when perceiving bonds from the DFT geometry.
_COVALENT_FACTORS = (1.3, 1.45, 1.6)


@dataclass
class MolGraph:
    """One molecule: node features, optional positions, undirected bonds (i < j) and bond types."""

    x: np.ndarray            # [n, F] uint8 (QM9 format) or int64 (categorical format)
    pos: np.ndarray | None   # [n, 3] float32, Å
    bonds: np.ndarray        # [b, 2] int32
    bond_attr: np.ndarray    # [b] uint8 bond-type index (QM9 format) or [b, 3] int64 (categorical)
    geometry_only: bool = False  # bonds perceived from the geometry alone (SMILES did not match)


def _rdkit():
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    return Chem


def parse_number_list(text: str) -> np.ndarray:
    """``"[[0.1,0.,1.],[...]]"`` (qm9pack's coordinate column) -> flat float64 array."""
    return np.array(text.replace("[", " ").replace("]", " ").replace(",", " ").split(), dtype=np.float64)


def _geometry_mol(elements: Sequence[str], positions: np.ndarray):
    Chem = _rdkit()
    from rdkit.Geometry import Point3D

    mol = Chem.RWMol()
    for symbol in elements:
        mol.AddAtom(Chem.Atom(symbol))
    conf = Chem.Conformer(len(elements))
    for i, (x, y, z) in enumerate(positions):
        conf.SetAtomPosition(i, Point3D(float(x), float(y), float(z)))
    mol.AddConformer(conf, assignId=True)
    return mol


def _connectivity(elements: Sequence[str], positions: np.ndarray, cov_factor: float):
    from rdkit.Chem import rdDetermineBonds

    mol = _geometry_mol(elements, positions)
    rdDetermineBonds.DetermineConnectivity(mol, covFactor=cov_factor)
    mol.UpdatePropertyCache(strict=False)
    return mol


def _graph_query(template):
    """The template with every bond single, nothing aromatic and no charges: matches atoms by element."""
    Chem = _rdkit()
    query = Chem.RWMol(template)
    for atom in query.GetAtoms():
        atom.SetIsAromatic(False)
        atom.SetFormalCharge(0)
    for bond in query.GetBonds():
        bond.SetBondType(Chem.BondType.SINGLE)
        bond.SetIsAromatic(False)
    query.UpdatePropertyCache(strict=False)
    return query


def _qm9_atom_rows(mol, features: str) -> np.ndarray:
    """Per-atom QM9 features except the H count (filled from the graph afterwards)."""
    Chem = _rdkit()
    hyb = Chem.rdchem.HybridizationType
    rows = np.zeros((mol.GetNumAtoms(), QM9_NODE_FEATURES), dtype=np.uint8)
    for atom in mol.GetAtoms():
        symbol = atom.GetSymbol()
        if symbol not in QM9_ELEMENTS:
            raise ValueError(f"element {symbol} is outside QM9's H, C, N, O, F")
        row = rows[atom.GetIdx()]
        row[QM9_ELEMENTS.index(symbol)] = 1
        row[5] = atom.GetAtomicNum()
        if features == "full":
            row[6] = int(atom.GetIsAromatic())
            h = atom.GetHybridization()
            row[7], row[8], row[9] = int(h == hyb.SP), int(h == hyb.SP2), int(h == hyb.SP3)
    return rows


def _bond_type_index(bond, features: str) -> int:
    Chem = _rdkit()
    kind = bond.GetBondType()
    if features == "full" and bond.GetIsAromatic():
        return 3
    return {Chem.BondType.SINGLE: 0, Chem.BondType.DOUBLE: 1, Chem.BondType.TRIPLE: 2,
            Chem.BondType.AROMATIC: 3}.get(kind, 0)


def _template(smiles: str, features: str):
    """Sanitised molecule with explicit H; Kekulé (aromatic flags cleared) for ``features="pyg"``."""
    Chem = _rdkit()
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    mol = Chem.AddHs(mol)
    if features == "pyg":
        Chem.Kekulize(mol, clearAromaticFlags=True)
    return mol


def _finish_qm9(rows: np.ndarray, bonds: list[tuple[int, int]], types: list[int], pos, geometry_only: bool) -> MolGraph:
    bond_arr = np.array(sorted((min(a, b), max(a, b), t) for (a, b), t in zip(bonds, types, strict=True)),
                        dtype=np.int64)
    bond_arr = bond_arr.reshape(-1, 3)
    is_h = rows[:, 0].astype(np.int64)
    num_h = np.zeros(len(rows), dtype=np.int64)
    if len(bond_arr):
        np.add.at(num_h, bond_arr[:, 0], is_h[bond_arr[:, 1]])
        np.add.at(num_h, bond_arr[:, 1], is_h[bond_arr[:, 0]])
    rows[:, 10] = num_h
    return MolGraph(rows, None if pos is None else np.asarray(pos, dtype=np.float32),
                    bond_arr[:, :2].astype(np.int32), bond_arr[:, 2].astype(np.uint8), geometry_only)


def qm9_graph_from_xyz(smiles: str, elements: Sequence[str], positions: np.ndarray,
                       features: str = "pyg") -> MolGraph:
    """QM9-format graph of a molecule given by its SMILES and its DFT geometry (atoms in xyz order).

    Bonds and bond orders come from the SMILES, mapped onto the xyz atoms by matching the SMILES graph
    into the bonds perceived from the geometry (covalent radii x 1.3, widened to 1.45 and 1.6 when a
    strained bond is longer than that). The geometry may show extra close contacts (bicyclic cages);
    only the SMILES bonds are kept. If no match exists, the geometry's connectivity at x 1.3 is used
    with single bonds (``geometry_only=True``).
    """
    positions = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    template = _template(smiles, features)
    if template is not None and template.GetNumAtoms() == len(elements):
        query = _graph_query(template)
        for factor in _COVALENT_FACTORS:
            geometry = _connectivity(elements, positions, factor)
            if geometry.GetNumBonds() < template.GetNumBonds():
                continue
            match = geometry.GetSubstructMatch(query)
            if match:
                rows = np.zeros((len(elements), QM9_NODE_FEATURES), dtype=np.uint8)
                rows[list(match)] = _qm9_atom_rows(template, features)
                bonds = [(match[b.GetBeginAtomIdx()], match[b.GetEndAtomIdx()]) for b in template.GetBonds()]
                types = [_bond_type_index(b, features) for b in template.GetBonds()]
                return _finish_qm9(rows, bonds, types, positions, geometry_only=False)
    geometry = _connectivity(elements, positions, _COVALENT_FACTORS[0])
    rows = _qm9_atom_rows(geometry, "pyg")
    bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in geometry.GetBonds()]
    return _finish_qm9(rows, bonds, [0] * len(bonds), positions, geometry_only=True)


def qm9_graph_from_smiles(smiles: str, features: str = "pyg", seed: int = 0) -> MolGraph | None:
    """QM9-format graph from a SMILES alone, with an ETKDG conformer for the positions.

    The conformer is RDKit's ETKDG embedding (seeded, no force-field optimisation), not the DFT
    geometry; when embedding fails the 2-D depiction coordinates (z = 0) are used. Returns None for
    an unparsable SMILES.
    """
    from rdkit.Chem import AllChem

    template = _template(smiles, "full")
    if template is None:
        return None
    params = AllChem.ETKDGv3()
    params.randomSeed = seed
    if AllChem.EmbedMolecule(template, params) != 0:
        AllChem.Compute2DCoords(template)
    pos = template.GetConformer().GetPositions()
    if features == "pyg":
        _rdkit().Kekulize(template, clearAromaticFlags=True)
    rows = _qm9_atom_rows(template, features)
    bonds = [(b.GetBeginAtomIdx(), b.GetEndAtomIdx()) for b in template.GetBonds()]
    types = [_bond_type_index(b, features) for b in template.GetBonds()]
    return _finish_qm9(rows, bonds, types, pos, geometry_only=False)


def categorical_graph_from_smiles(smiles: str) -> MolGraph | None:
    """Heavy-atom graph with ``torch_geometric.utils.from_smiles``'s integer features (None if invalid)."""
    from torch_geometric.utils import from_smiles

    Chem = _rdkit()
    if Chem.MolFromSmiles(smiles) is None:
        return None
    data = from_smiles(smiles)
    edge_index = data.edge_index.numpy()
    keep = edge_index[0] < edge_index[1]  # from_smiles lists both directions; keep one
    return MolGraph(data.x.numpy().astype(np.int64), None, edge_index[:, keep].T.astype(np.int32),
                    data.edge_attr.numpy()[keep].astype(np.int64))


def categorical_vocab_sizes() -> tuple[list[int], list[int]]:
    """Number of values of each atom and bond column of :func:`categorical_graph_from_smiles`."""
    from torch_geometric.utils.smiles import e_map, x_map

    return [len(v) for v in x_map.values()], [len(v) for v in e_map.values()]
