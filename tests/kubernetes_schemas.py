"""Validation of custom resources against the CRD schemas vendored in k8s/schemas/ (versions.yaml names
the releases), as the API server's strict field validation does: types, enums, required fields and
minimums from the schema, and an unknown field anywhere the schema does not preserve unknown fields
is an error. CEL rules (x-kubernetes-validations) are not evaluated offline."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "k8s" / "schemas"


@functools.cache
def versions() -> dict[str, Any]:
    return yaml.safe_load((SCHEMAS / "versions.yaml").read_text())


def _strict(node: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object that lists its properties."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def _validators() -> dict[tuple[str, str], Any]:
    import jsonschema

    found = {}
    for release in versions().values():
        for kind, file in (release.get("files") or {}).items():
            doc = json.loads((SCHEMAS / file).read_text())
            assert doc["kind"] == kind, file
            schema = _strict(doc["openAPIV3Schema"])
            # the API server validates metadata itself; the CRD schema only says it is an object
            schema["properties"]["metadata"] = {"type": "object"}
            found[(f"{doc['group']}/{doc['version']}", kind)] = jsonschema.Draft7Validator(schema)
    return found


def custom_kinds() -> set[tuple[str, str]]:
    return set(_validators())


def errors(obj: dict[str, Any]) -> list[str]:
    """Every schema violation of ``obj`` as ``path: message``; raises KeyError for a kind with no schema."""
    validator = _validators()[(obj["apiVersion"], obj["kind"])]
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in validator.iter_errors(copy.deepcopy(obj)))
