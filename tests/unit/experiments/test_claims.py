"""The claims registry, its verdict rules and the generated ledger (`mtlflow.experiments.claims`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtlflow.core import atomic
from mtlflow.experiments import claims
from mtlflow.experiments.claims.runners import run_toy_escape
from mtlflow.metrics.intervals import difference_interval, format_estimate, mean_interval

REPO = Path(__file__).resolve().parents[3]


def _claim(rule: str, value: float | None, lower_is_better: bool = True, tolerance: float = 0.0) -> claims.Claim:
    return claims.Claim(key="t", paper="P", source="Table 1", statement="s", paper_text="x", paper_value=value,
                        metric="m", rule=rule, lower_is_better=lower_is_better, runner=run_toy_escape,
                        scales={}, tolerance=tolerance)


@pytest.mark.parametrize("values, expected", [
    ([1.00, 1.01, 1.02], claims.REPRODUCED),       # the whole interval ≤ 1.11
    ([1.20, 1.21, 1.22], claims.NOT_REPRODUCED),   # the whole interval > 1.11
    ([1.00, 1.10, 1.25], claims.WITHIN),           # 1.11 inside the interval
])
def test_at_most_verdict_follows_where_the_bound_lies_in_the_interval(values, expected):
    estimate = mean_interval(values)  # the premise of each case, checked on the interval itself
    inside = estimate.low <= 1.11 <= estimate.high
    assert inside == (expected == claims.WITHIN)
    assert claims.judge(_claim("at_most", 1.11), values)["verdict"] == expected


def test_at_least_is_the_mirror_of_at_most():
    assert claims.judge(_claim("at_least", 5.0, False), [5.0, 5.0, 5.0])["verdict"] == claims.REPRODUCED
    assert claims.judge(_claim("at_least", 5.0, False), [3.0, 3.0, 4.0])["verdict"] == claims.NOT_REPRODUCED
    assert claims.judge(_claim("at_least", 5.0, False), [3.0, 5.0, 5.0])["verdict"] == claims.WITHIN


def test_equals_uses_the_tolerance_then_the_interval():
    assert claims.judge(_claim("equals", 4.2, tolerance=0.05), [4.186])["verdict"] == claims.REPRODUCED
    assert claims.judge(_claim("equals", 4.2, tolerance=0.05), [4.0])["verdict"] == claims.NOT_REPRODUCED
    assert claims.judge(_claim("equals", 4.2, tolerance=0.05), [3.9, 4.0, 4.5])["verdict"] == claims.WITHIN


def test_gain_verdict_uses_the_stratified_difference_and_the_paper_difference():
    lower = _claim("gain", -0.9)
    better, base = [1.0, 1.1, 1.2], [2.0, 2.1, 2.2]
    out = claims.judge(lower, better, base)
    assert out["verdict"] == claims.REPRODUCED
    diff = difference_interval(better, base)
    assert out["difference"]["difference"] == pytest.approx(-1.0)
    assert (out["difference"]["low"], out["difference"]["high"]) == (diff.low, diff.high)
    # overlapping seeds: the interval holds 0; it holds the paper's -0.9 too -> within interval
    noisy, noisy_base = [1.0, 2.5, 0.5], [2.0, 1.5, 2.2]
    d = difference_interval(noisy, noisy_base)
    assert d.low <= -0.9 <= d.high and d.low <= 0 <= d.high
    assert claims.judge(lower, noisy, noisy_base)["verdict"] == claims.WITHIN
    # the method worse than its baseline
    assert claims.judge(lower, base, better)["verdict"] == claims.NOT_REPRODUCED


def test_every_claim_has_both_scales_three_seeds_or_a_reason_and_a_judgeable_rule():
    assert {"cost-toy-escape", "asmg-synthetic", "ldcmtl-step-time", "palora-overhead-cityscapes",
            "forum-hypercleaning", "normal-office31"} <= set(claims.CLAIMS)
    for claim in claims.CLAIMS.values():
        assert set(claim.scales) == set(claims.SCALES), claim.key
        assert claim.rule in claims.RULES, claim.key
        assert claim.paper_value is not None or claim.rule == "gain", claim.key
        for scale in claim.scales.values():
            assert len(scale.seeds) >= 3 or claim.no_seeds, claim.key
        if claim.rule == "gain":
            assert {"method", "baseline"} <= set(claim.scales["ci"].config), claim.key


def test_unknown_claim_scale_and_setting_are_one_line_errors(tmp_path):
    from mtlflow.core.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="unknown claim 'nope'"):
        claims.get("nope")
    with pytest.raises(InvalidParameterError, match="--scale"):
        claims.reproduce("cost-toy-escape", "huge", tmp_path)
    with pytest.raises(InvalidParameterError, match="--set stepz"):
        claims.reproduce("cost-toy-escape", "ci", tmp_path, config_override={"stepz": 1})


def _ledger_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        match = re.match(r"\| `([a-z0-9-]+)` \| (.*) \|$", line)
        if match and match.group(1) in claims.CLAIMS and match.group(1) not in rows:
            rows[match.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", match.group(2))]
    return rows


def test_the_committed_ledger_is_generated_from_the_committed_result_files():
    results = REPO / claims.RESULTS_DIR
    ledger = (REPO / claims.LEDGER_PATH).read_text()
    assert ledger == claims.ledger_markdown(results), "docs/research/claims.md is stale: run `make claims-ledger`"
    rows = _ledger_rows(ledger)
    assert set(rows) == set(claims.CLAIMS)
    records = claims.read_results(results)
    for key, row in rows.items():
        if key not in records:
            assert row[5].startswith("not yet run here") and f"mtlflow reproduce {key} --scale ci" in row[5]
            data = claims.CLAIMS[key].data
            assert data is None or (data in row[5] and f"mtlflow reproduce {key} --scale paper" in row[5])
            continue
        record = records[key]
        estimate = mean_interval(record["values"])  # recomputed from every seed's value in the file
        assert estimate.as_dict() == pytest.approx(record["estimate"])
        if claims.CLAIMS[key].no_seeds:
            assert row[2] == f"{record['values'][0]:.3f} ({claims.CLAIMS[key].no_seeds})"
        else:
            assert row[2] == f"{format_estimate(estimate, digits=3)}, n = {estimate.n}"
        assert row[5].startswith(record["verdict"])
        if record["baseline_values"]:  # the difference, recomputed from both sides' seeds
            diff = difference_interval(record["values"], record["baseline_values"])
            assert (diff.mean, diff.low, diff.high) == pytest.approx(
                (record["difference"]["difference"], record["difference"]["low"], record["difference"]["high"]))
            assert row[3].startswith(format_estimate(diff, digits=3) + " (baseline "), (key, row[3])
        assert claims.judge(claims.CLAIMS[key], record["values"], record["baseline_values"])["verdict"] == \
            record["verdict"]
        assert len(record["values"]) >= 3 or claims.CLAIMS[key].no_seeds


def test_a_result_file_of_another_scale_or_claim_is_kept_out_of_the_ledger(tmp_path):
    atomic.write_json(tmp_path / "palora-overhead-nyuv2.paper.json", {"claim": "palora-overhead-nyuv2"})
    assert claims.read_results(tmp_path) == {}
    atomic.write_json(tmp_path / "stray.json", {"claim": "stray", "scale": "ci"})
    from mtlflow.core.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="stray.json"):
        claims.read_results(tmp_path)


def test_a_strict_bound_is_not_met_by_the_bound_itself():
    # PaLoRA's monotone front: ρ < 0; a flat front (ρ = 0 on every seed) is not monotone
    strict = claims.get("palora-front-monotone")
    assert strict.strict and strict.rule == "at_most" and strict.paper_value == 0.0
    assert claims.judge(strict, [0.0, 0.0, 0.0])["verdict"] == claims.NOT_REPRODUCED
    assert claims.judge(strict, [-0.9, -0.8, -1.0])["verdict"] == claims.REPRODUCED
    assert claims.judge(_claim("at_most", 0.0), [0.0, 0.0, 0.0])["verdict"] == claims.REPRODUCED


def test_claims_share_runs_only_where_a_label_means_the_same_method_setting():
    # runs are reused by (runs folder, label): one label in one folder must always be the same training
    seen: dict[tuple[str, str], dict] = {}
    for claim in claims.CLAIMS.values():
        for scale, chosen in claim.scales.items():
            config = chosen.config
            for side in ("method", "baseline"):
                if isinstance(config.get(side), dict):
                    key = (f"{scale}-{claims.runs_digest(config)}", config[side]["label"])
                    assert seen.setdefault(key, config[side]) == config[side], (claim.key, key)
    ci = claims.get("cost-cityscapes").scales["ci"].config
    assert claims.runs_digest(ci) == claims.runs_digest(claims.get("ldcmtl-celeba").scales["ci"].config)
    assert claims.runs_digest(ci) != claims.runs_digest(ci, {"mnist_dir": "/elsewhere"})
    assert claims.runs_digest(ci) != claims.runs_digest({**ci, "train": {"epochs": 4}})


# COST's ablation claims -> (row of `mtlflow ablate cost` the claim's method is, row its baseline is)
COST_ABLATION_ROWS = {"cost-ablation-no-lt": ("full", "no-lt"), "cost-ablation-no-lg": ("full", "no-lg"),
                      "cost-ablation-no-htr": ("full", "no-htr"), "cost-adapter-lora": ("adapter-lora", "adapter-loha"),
                      "cost-trigger-dominated": ("trigger-dominated", "trigger-weak")}


def test_cost_ablation_claims_train_the_rows_of_the_ablation_table():
    # a ledger row of Tables 4, 7, 8 compares the same two COST settings as `mtlflow ablate cost`'s table
    # (paper scale: components with the dominated trigger; ci: with the weak one, `ablate cost --trigger weak`),
    # compared as resolved COST options, so a default written out or left implicit is the same setting
    from mtlflow.experiments.cost_ablation import ablation_rows
    from mtlflow.teleport.options import CostOptions

    def resolved(options):
        return CostOptions.from_mapping(options or {}).resolved().as_dict()

    for scale, component_trigger in (("paper", "dominated"), ("ci", "weak")):
        rows = {r.key: r for r in ablation_rows("fairgrad", component_trigger)}
        for key, (method_row, baseline_row) in COST_ABLATION_ROWS.items():
            config = claims.get(key).scales[scale].config
            for side, row in (("method", method_row), ("baseline", baseline_row)):
                spec = config[side]
                assert (spec["method"], spec["teleport"]) == ("fairgrad", "cost"), (key, side)
                assert resolved(spec.get("teleport_options")) == resolved(rows[row].options), (key, scale, side)
            assert resolved(config["method"].get("teleport_options")) != resolved(config["baseline"].get(
                "teleport_options")), key


def test_normal_ablation_claims_change_only_the_ablated_choice():
    # thesis Table 5.4: each baseline is NORMAL with one choice changed (two for constant-but-different positions:
    # positions fixed and set per task), the method is NORMAL at its defaults
    from mtlflow.models.normal import resolve_options

    changed = {"normal-ablation-fixed-positions": {"learn_positions"},
               "normal-ablation-exp-positions": {"position_param"}, "normal-ablation-first-order": {"order"},
               "normal-ablation-different-positions": {"learn_positions", "initial_positions"},
               "normal-ablation-shared-layers": {"replace_ode"}, "normal-ablation-task-layers": {"replace_ode"}}
    defaults = resolve_options({})
    for key, options in changed.items():
        for scale in claims.SCALES:
            config = claims.get(key).scales[scale].config
            assert config["method"]["architecture"] == config["baseline"]["architecture"] == "normal"
            assert resolve_options(dict(config["method"].get("architecture_options", {}))) == defaults
            ablated = resolve_options(dict(config["baseline"]["architecture_options"]))
            assert {k for k in defaults if ablated[k] != defaults[k]} == options, (key, scale)
    tasks = {"paper": 3, "ci": 2}  # Office-31's three domains, MultiMNIST's two digits: one position per task
    for scale, n in tasks.items():
        options = claims.get("normal-ablation-different-positions").scales[scale].config["baseline"]
        assert len(set(options["architecture_options"]["initial_positions"])) == n


def test_every_seed_paper_table_of_the_issue_has_a_row():
    # issue 31's list: COST's gains and ablations (Tables 1-8), PaLoRA's Table 4 against LS and PaMaL, LDC-MTL's
    # tables (CelebA, QM9, Cityscapes, NYU-v2), the thesis' Table 3.2 (MOML and MoCo), Tables 5.1-5.4
    expected = {"cost-cityscapes", "cost-nyuv2", "cost-celeba", "cost-ablation-no-lt", "cost-ablation-no-lg",
                "cost-ablation-no-htr", "cost-trigger-dominated", "cost-adapter-lora", "cost-plugin-cagrad",
                "cost-plugin-nashmtl", "cost-plugin-cagrad-nyuv2", "palora-multimnist-accuracy",
                "palora-multimnist-accuracy-pamal", "ldcmtl-celeba", "ldcmtl-qm9", "ldcmtl-cityscapes",
                "ldcmtl-nyuv2", "forum-hypercleaning", "forum-hypercleaning-moco", "normal-office31",
                "normal-officehome", "normal-nyuv2", "normal-celeba", "normal-ablation-fixed-positions",
                "normal-ablation-different-positions", "normal-ablation-exp-positions", "normal-ablation-first-order",
                "normal-ablation-shared-layers", "normal-ablation-task-layers"}
    assert expected <= set(claims.CLAIMS)
    for key in expected:  # data the machine lacks is named with the option that points at it
        claim = claims.get(key)
        benchmark = claim.scales["paper"].config["benchmark"]
        if benchmark in ("cityscapes", "nyuv2", "celeba", "office31", "officehome"):
            assert claim.data and "--data-dir" in claim.data, key
