"""The docs' deviation tables and documented defaults match the code (issue 12's last acceptance point).

The hyper-parameter tables of the research notes are parsed from the Markdown and compared with the
``HParam`` defaults the generated method pages show; every ``--hp`` / ``--teleport-option`` /
``--arch-option`` assignment the audited pages name is validated by the method, COST's options or the
architecture it belongs to; the defaults stated in prose (the methods overview, the thesis notes, the
per-benchmark recipes) are read from the code path that applies them (``methods.info``,
``Benchmark.method_defaults``, ``RunConfig.for_benchmark``); the scale-convention switch of the
overview's deviation table changes the convention of exactly the methods it lists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtlflow import benchmarks, methods
from mtlflow.cli.common import parse_value
from mtlflow.config.run import RunConfig
from mtlflow.models import architectures
from mtlflow.teleport.options import VARIANT_DEFAULTS, CostOptions

DOCS = Path(__file__).resolve().parents[3] / "docs"
AUDITED = ["research/cost.md", "research/ldc-mtl.md", "research/normal.md", "research/palora.md",
           "research/thesis.md", "research/toy-and-bench.md", "methods/index.md"]
#: the method a research page's inline ``--hp`` assignments belong to (when no ``--method`` names one)
PAGE_METHODS = {"research/ldc-mtl.md": ["ldcmtl"], "research/palora.md": ["palora"],
                "research/thesis.md": ["moml", "forum", "asmg", "asmg-ew"]}
#: phrases the tables use for "no value" (the code's None)
NONE_WORDS = {"none", "–", "-", "the model's lr", "feature width"}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _table(page: str, header: str) -> list[list[str]]:
    """The body rows of the table in ``page`` whose header row starts with ``header``."""
    lines = (DOCS / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(_cells(line))
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", cell)


def _documented_value(text: str):
    """A default cell's value: a backticked word is that string, else the leading number/boolean/phrase."""
    text = text.strip()
    quoted = re.match(r"`([^`]+)`", text)
    if quoted:
        return quoted.group(1)
    if text.lower() in NONE_WORDS or text.split(" ")[0].lower() in NONE_WORDS:
        return None
    token = re.match(r"[^\s(]+", text).group(0)
    if token in ("true", "false"):
        return token == "true"
    return float(token)


def _documented_defaults(page: str, header: str) -> dict[str, object]:
    """``{option: documented default}`` of a (name | default | meaning) table; a row naming several
    options lists their defaults in the same order, comma-separated."""
    out: dict[str, object] = {}
    for cells in _table(page, header):
        names = _names(cells[0].split(" ")[0] if cells[0].count("`") == 2 else cells[0])
        values = cells[1].split(", ") if len(names) > 1 else [cells[1]]
        assert len(values) == len(names), f"{page}: row {cells[0]!r} names {len(names)} options, {len(values)} values"
        out.update({n: _documented_value(v) for n, v in zip(names, values, strict=True)})
    return out


def _same(documented, actual) -> bool:
    if isinstance(documented, float) and not isinstance(actual, bool) and isinstance(actual, (int, float)):
        return documented == pytest.approx(actual, rel=1e-12)
    return documented == actual


@pytest.mark.parametrize("page,header,defaults", [
    ("research/ldc-mtl.md", "| hyper-parameter | default |",
     lambda: {k: v[0] for k, v in methods.info("ldcmtl").hparams.items()}),
    ("research/palora.md", "| `--hp` | default |",
     lambda: {k: v[0] for k, v in methods.info("palora").hparams.items()}),
    ("research/normal.md", "| option | value |", lambda: architectures.resolve("normal", {})),
])
def test_documented_option_tables_equal_the_code_defaults(page, header, defaults):
    documented, actual = _documented_defaults(page, header), defaults()
    assert len(documented) >= 8, f"{page}: the table parsed to {documented}"
    wrong = {k: (v, actual.get(k, "<no such option>")) for k, v in documented.items()
             if k not in actual or not _same(v, actual[k])}
    assert not wrong, f"{page}: documented default != code default (documented, code): {wrong}"


def test_ldcmtl_table_documents_every_hyper_parameter():
    documented = set(_documented_defaults("research/ldc-mtl.md", "| hyper-parameter | default |"))
    row_text = " ".join(" ".join(c) for c in _table("research/ldc-mtl.md", "| hyper-parameter | default |"))
    mentioned = documented | set(re.findall(r"`([a-z_]+)[`=]", row_text))
    assert set(methods.info("ldcmtl").hparams) <= mentioned


# -- COST's option table ------------------------------------------------------------------------------

#: research/cost.md's option table, transcribed (its cells mix values and prose): (paper, released)
COST_TABLE = {
    "trigger": ("dominated", "released"), "delay_epochs": (0, 0), "max_per_epoch": (1, 1), "check_every": (1, 1),
    "adapter": ("lora", "lora"), "rank": (5, 5), "steps": (8, None), "passes": (None, 2), "lr": (5e-3, None),
    "batches": (1, 0), "batch_size": (64, 0), "perturbations": (1, 5), "radius": (1.0, 1e-4),
    "gamma": (0.1, 0.5), "invariance_weight": (1.0, 10.0), "balance": ("softmax", "complement"),
    "reduction": ("max-of-mean", "mean-of-max"),
    "sharpness_gradient": ("through-perturbations", "unperturbed-only"), "invariance_target": ("batch", "mean"),
    "eval_mode": (False, True), "htr_reference": ("mean-gradient", "last-update"),
    "htr_nonpositive": ("restart", "restart"), "htr_bias_correction": ("rescale", "none"),
    "use_invariance": (True, True), "use_sharpness": (True, True), "htr": (True, True),
}


def test_cost_option_table_names_real_options_and_its_values_are_the_resolved_defaults():
    rows = _table("research/cost.md", "| option | default (`variant=paper`) |")
    named = {n for cells in rows for n in _names(cells[0])}
    fields = set(CostOptions().as_dict())
    assert named - fields == set(), f"cost.md names options COST does not have: {named - fields}"
    assert named <= set(COST_TABLE) | {"passes"}, f"rows not transcribed in COST_TABLE: {named - set(COST_TABLE)}"
    for cells in rows:  # the table's values for the options the transcription gives as plain tokens
        # a row naming several options may give plain-token values for its first ones only: zip pairs those
        for name, value in zip(_names(cells[0]), re.findall(r"`([a-z-]+)`", cells[1]), strict=False):
            assert COST_TABLE[name][0] == value, (name, cells[1])
    for variant, column in (("paper", 0), ("released", 1)):
        resolved = CostOptions(variant=variant).resolved().as_dict()
        wrong = {k: (v[column], resolved[k]) for k, v in COST_TABLE.items() if not _same(v[column], resolved[k])}
        assert not wrong, f"variant={variant}: documented != resolved (documented, code): {wrong}"
    assert set(VARIANT_DEFAULTS["paper"]) - {"noise"} <= set(COST_TABLE)


# -- every named assignment is accepted ----------------------------------------------------------------

_ASSIGN = re.compile(r"--(hp|teleport-option|arch-option)((?:\s+[\w.]+=[^\s`|\\]+(?:\\?\|[^\s`|\\]+)*)+)")


def _assignments(text: str) -> list[tuple[str, str, str]]:
    """(kind, key, raw value) of every ``--hp k=v [k=v ...]`` style assignment in ``text``."""
    out = []
    for kind, group in _ASSIGN.findall(text):
        for item in group.split():
            key, _, raw = item.partition("=")
            for alternative in re.split(r"\\?\|", raw):  # `--hp normalization=l2\|loss\|loss+` lists alternatives
                out.append((kind, key, alternative))
    return out


def _placeholder(raw: str) -> bool:
    return raw in ("N", "VALUE", "[...]", "...") or raw.startswith("<")


def _method_accepts(name: str, hparams: dict) -> bool:
    try:
        methods.build(name, 3 if "rays" in hparams else 2, **hparams)
    except Exception as error:  # noqa: BLE001 -- any refusal means "not accepted" ...
        # ... except a valid optional solver that this environment lacks (Nash-MTL's ECOS, MOSEK)
        return "is not installed" in str(error)
    return True


def _try(build) -> bool:
    try:
        build()
    except Exception:  # noqa: BLE001 -- any refusal means "not accepted"
        return False
    return True


def _registered(names) -> list[str]:
    return [n for n in names if n in methods.available()]


def _chunks(page: str) -> list[tuple[list[str], bool, str]]:
    """(methods in context, whether every one of them must accept, text): a shell command with its
    ``--method(s)`` and a row of the methods overview with its first cell (every one), else a paragraph
    with the page's methods or the ones it names (any one)."""
    text = (DOCS / page).read_text().replace("\\\n", " ")
    chunks = []
    for paragraph in text.split("\n\n"):
        rest = []
        for line in paragraph.splitlines():
            named = re.findall(r"--methods?\s+([\w,-]+)", line)
            if named:
                chunks.append(([m for group in named for m in group.split(",")], True, line))
            elif page == "methods/index.md" and line.startswith("| `"):
                chunks.append((_registered(re.findall(r"`([\w-]+)`", _cells(line)[0])), True, line))
            else:
                rest.append(line)
        body = "\n".join(rest)
        chunks.append((PAGE_METHODS.get(page) or _registered(re.findall(r"`([\w-]+)`", body)), False, body))
    return chunks


def test_every_documented_assignment_is_accepted():
    """Each assignment is validated alone or together with the other assignments of its command or row
    (``reinit`` needs ``params``) by the methods in context: every method a command or an overview row
    names, any method a paragraph names, every registered method when none is named."""
    checked, refused = 0, []
    for page in AUDITED:
        for context, every, chunk in _chunks(page):
            found = [(kind, key, raw) for kind, key, raw in _assignments(chunk) if not _placeholder(raw)]
            for kind, key, raw in found:
                owner, _, bare = key.rpartition(".")
                together = {k.rpartition(".")[2]: parse_value(r) for kd, k, r in found
                            if kd == kind and k.rpartition(".")[0] == owner}
                together[bare] = parse_value(raw)
                alone = {bare: parse_value(raw)}
                if kind == "teleport-option":
                    ok = any(_try(lambda o=o: CostOptions.from_mapping(o)) for o in (alone, together))
                elif kind == "arch-option":
                    ok = any(_try(lambda o=o: architectures.resolve("normal", o)) for o in (alone, together))
                else:
                    candidates = _registered([owner] if owner else context)
                    if candidates:
                        accepted = [any(_method_accepts(m, o) for o in (alone, together)) for m in candidates]
                        ok = all(accepted) if every and not owner else any(accepted)
                    else:  # `scale_convention` (accepted by every method)
                        ok = all(_method_accepts(m, alone) for m in methods.available())
                checked += 1
                if not ok:
                    refused.append(f"{page}: --{kind} {key}={raw} (for {context})")
    assert not refused, "\n".join(refused)
    assert checked >= 40, f"only {checked} assignments found: the parser no longer reads the docs"


def test_the_parser_reads_multi_assignments_and_alternatives():
    assert _assignments("`--hp lambda_update=softmax normalize_grads=true step_scale=none` = LibMTL") == [
        ("hp", "lambda_update", "softmax"), ("hp", "normalize_grads", "true"), ("hp", "step_scale", "none")]
    assert _assignments(r"`--hp normalization=l2\|loss\|loss+` normalises") == [
        ("hp", "normalization", "l2"), ("hp", "normalization", "loss"), ("hp", "normalization", "loss+")]
    assert _assignments("(`--hp solver=CLARABEL|ECOS`) is") == [("hp", "solver", "CLARABEL"), ("hp", "solver", "ECOS")]
    assert not _method_accepts("mgdaub", {"normalization": "no-such"})


# -- defaults stated in prose --------------------------------------------------------------------------

PROSE_DEFAULTS = [  # (method, hyper-parameter, documented value, where)
    ("mgda", "solver", "qp", "methods/index.md: exact QP by default"),
    ("mgdaub", "normalization", "none", "methods/index.md: default none = the paper"),
    ("fairgrad", "alpha", 1.0, "methods/index.md: α = 1 by default"),
    ("dwa", "temperature", 2.0, "methods/index.md: T = 2"),
    ("dwa", "window", "epoch", "methods/index.md: epoch-mean losses (paper)"),
    ("dwa", "iteration_window", 25, "methods/index.md: 25-step windows"),
    ("gradnorm", "alpha", 1.5, "methods/index.md: α = 1.5"),
    ("dbmtl", "beta", 0.9, "methods/index.md: EMA β = 0.9"),
    ("stch", "mu", 1.0, "methods/index.md: μ = 1"),
    ("stch", "warmup_epochs", 4, "methods/index.md: 4 warm-up epochs"),
    ("graddrop", "leak", 0.0, "methods/index.md: leak 0"),
    ("gradvac", "beta", 0.5, "methods/index.md: β = 0.5"),
    ("cagrad", "c", 0.4, "methods/index.md: c = 0.4"),
    ("cagrad", "rescale", 0, "methods/index.md: rescale=1 = the official ÷(1 + c²), not the default"),
    ("nashmtl", "solver", "CLARABEL", "methods/index.md: Clarabel by default"),
    ("nashmtl", "two_task_closed_form", True, "methods/index.md: K = 2 exact closed form"),
    ("nashmtl", "max_norm", 0.0, "methods/index.md: no clipping (the paper)"),
    ("moco", "beta", 0.5, "methods/index.md: β = 0.5/k^0.5"),
    ("moco", "beta_sigma", 0.5, "methods/index.md: β = 0.5/k^0.5"),
    ("moco", "gamma", 0.1, "methods/index.md: γ = 0.1/k^0.5"),
    ("moco", "gamma_sigma", 0.5, "methods/index.md: γ = 0.1/k^0.5"),
    ("moco", "step_scale", "trace", "methods/index.md: divided by trace(YYᵀ)/K"),
    ("moco", "lambda_update", "projection", "methods/index.md: Π_Δ"),
    ("alignedmtl", "scale_mode", "min", "methods/index.md: σ = σ_min"),
    ("upgrad", "solver", "nnls", "methods/index.md: K exact NNLS problems"),
    ("upgrad", "reg_eps", 1e-4, "methods/index.md: quadprog's ridge reg_eps = 1e-4"),
    ("excessmtl", "robust_step_size", 1e-2, "methods/index.md: η = 1e-2"),
    ("excessmtl", "warmup_epochs", 0, "methods/index.md: baseline = the first step's"),
    ("moml", "inner_steps", 1, "thesis.md: T = 1"), ("moml", "inner_lr", 0.1, "thesis.md: LL step 0.1"),
    ("moml", "outer_optimizer", "adam", "thesis.md: UL Adam"), ("moml", "outer_lr", 1e-3, "thesis.md: UL 1e-3"),
    ("moml", "upper_solver", "mgda", "thesis.md: MGDA"), ("moml", "upper", "task-weights", "thesis.md"),
    ("moml", "simplex", "projection", "thesis.md"), ("moml", "upper_split", "val", "thesis.md"),
    ("forum", "rho", 0.1, "thesis.md: ρ = 0.1"), ("forum", "inner_steps", 5, "thesis.md: T = 5"),
    ("forum", "inner_lr", 0.1, "thesis.md: η = 0.1"), ("forum", "outer_lr", 1e-3, "thesis.md: UL Adam 1e-3"),
    ("forum", "beta_power", 0.75, "thesis.md: β_k = (k+1)^(-3/4)"),
    ("forum", "normalize_upper_grads", False, "thesis.md: the authors' code's choice is an option"),
    ("asmg", "beta", 0.5, "thesis.md: β = 0.5"), ("asmg", "n_samples", 20, "thesis.md: N = 20"),
    ("asmg", "sigma0", 1.0, "thesis.md: Σ_0 = I"), ("asmg", "update", "normalized", "thesis.md: App. A.2.5"),
    ("asmg", "min_precision_ratio", 0.1, "thesis.md: floored at 0.1"),
    ("famo", "gamma", 1e-3, "famo's docstring: γ = 0.001"),
]


@pytest.mark.parametrize("method,key,value,where", PROSE_DEFAULTS, ids=lambda v: str(v)[:24])
def test_prose_defaults_equal_the_code(method, key, value, where):
    assert _same(value, methods.info(method).hparams[key][0]), where


def test_method_lr_of_learned_weights_is_the_documented_0_025():
    assert RunConfig().method_lr == 0.025  # methods/index.md (uw), research/toy-and-bench.md


# -- per-benchmark defaults (LDC-MTL Table 5, PaLoRA Table 1, thesis recipes) ----------------------------

BENCHMARK_DEFAULTS = [  # (benchmark, method, documented hyper-parameters, documented lr)
    ("celeba", "ldcmtl", {"penalty": 0.01, "form": "code", "tau": "sigma", "normalization": "none",
                          "router": "vector"}, 1e-3),
    ("qm9", "ldcmtl", {"penalty": 0.05, "form": "code", "tau": "sigma", "normalization": "log",
                       "router": "vector"}, 1e-3),
    ("cityscapes", "ldcmtl", {"penalty": 0.1, "form": "code", "tau": "one", "normalization": "none",
                              "router": "mlp", "router_bias": True}, 3e-4),
    ("nyuv2", "ldcmtl", {"penalty": 0.05, "form": "code", "tau": "one", "normalization": "none",
                         "router": "mlp", "router_bias": False}, 8e-5),
    ("toy", "ldcmtl", {"normalization": "rescale"}, None),
    ("cityscapes", "palora", {"rank": 4}, 1e-4), ("nyuv2", "palora", {"rank": 4}, 1e-4),
    ("qm9", "forum", {"inner_lr": 0.01}, None),
    ("hypercleaning", "moml", {"upper": "sample-weights", "inner_steps": 64, "inner_lr": 0.3,
                               "outer_optimizer": "sgd", "outer_lr": 10.0}, 0.03),
    ("hypercleaning", "forum", {"upper": "sample-weights", "rho": 0.5, "inner_steps": 64, "inner_lr": 0.3,
                                "outer_optimizer": "sgd", "outer_lr": 10.0}, 0.03),
    ("asmg-synthetic", "asmg", {"beta": 0.1, "n_samples": 50}, None),
]


@pytest.mark.parametrize("bench_name,method,documented,lr", BENCHMARK_DEFAULTS, ids=lambda v: str(v)[:16])
def test_benchmark_recipes_are_the_documented_ones(bench_name, method, documented, lr):
    bench = benchmarks.build(bench_name)
    applied = bench.method_defaults(method)
    assert {k: applied.get(k) for k in documented} == documented
    if lr is not None:
        config = RunConfig.for_benchmark(bench.train_defaults, method=method)
        assert config.lr == pytest.approx(lr)
        # the per-method step size is LDC-MTL's only: every other method keeps the shared recipe
        assert RunConfig.for_benchmark(bench.train_defaults, method="ls").lr == bench.train_defaults["lr"]


# -- the scale convention's deviation table ---------------------------------------------------------------

def test_scale_convention_switch_changes_exactly_the_listed_methods():
    rows = _table("methods/index.md", "| method | mtlflow default | switch to the reference |")
    listed = {n for cells in rows if "scale_convention=reference" in cells[2] for n in _names(cells[0])}
    assert listed == {"rlw", "famo", "imtlg", "moco", "upgrad"}
    for name in methods.available():
        plain, reference = methods.build(name, 2), methods.build(name, 2, scale_convention="reference")
        if name in listed:
            assert (plain.natural_scale, reference.natural_scale) == ("mean", "sum"), name
        else:
            assert reference.natural_scale == plain.natural_scale, f"{name} switches but is not in the table"


# -- the gradient engine's table: what each method makes the engine compute ---------------------------------

def _method_name(display: str) -> str:
    """``IMTL-G`` -> ``imtlg``, ``MGDA-UB (`mgdaub`)`` -> ``mgdaub``: a table's display name as registered."""
    quoted = re.search(r"`([\w-]+)`", display)
    return quoted.group(1) if quoted else re.sub(r"[^a-z0-9]", "", display.lower())


def test_requires_table_lists_every_method_by_what_it_needs():
    rows = _table("methods/index.md", "| `requires` | what the engine computes per step | methods |")
    documented = {}
    for cells in rows:
        # the names, without the parenthesised remarks and the prose after ';' (methods owning their step)
        listed = re.sub(r";.*", "", re.sub(r"\([^()]*(\([^()]*\)[^()]*)*\)", "", cells[2]))
        documented[cells[0].strip("`")] = {_method_name(n.strip()) for n in listed.split(", ") if n.strip()}
    actual: dict[str, set[str]] = {}
    for name in methods.available():
        cls = methods.get(name)
        if not cls.custom_step:  # methods owning their step compute what they need themselves (the row says so)
            actual.setdefault(cls.requires.value, set()).add(name)
    assert documented == actual


def test_toy_and_hypercleaning_settings_are_the_documented_ones():
    from mtlflow.experiments.trajectories import STEPS_PER_EPOCH, toy_options

    # research/cost.md: the toy's dense adapter, "toy defaults 50 steps, lr 0.05, δ = 0.5, ñ = 4; an epoch =
    # 1,000 steps"
    toy = toy_options({})
    assert (toy.steps, toy.lr, toy.radius, toy.perturbations, STEPS_PER_EPOCH) == (50, 0.05, 0.5, 4, 1000)
    # research/toy-and-bench.md: the 5 Nash-MTL/FAMO starts, Adam 1e-3, method parameters at 0.025, scale 0.1
    # on L1, 35,000 steps, min_losses (−21·scale, −21) and FAMO's γ = 0 of its toy script
    from mtlflow.benchmarks.toy import START_POINTS
    from mtlflow.experiments.trajectories import DEFAULT_LR, DEFAULT_STEPS, METHOD_LR

    assert START_POINTS == ((-8.5, 7.5), (0.0, 0.0), (9.0, 9.0), (-7.5, -0.5), (9.0, -1.0))
    assert (DEFAULT_LR, METHOD_LR, DEFAULT_STEPS) == (1e-3, 0.025, 35_000)
    bench = benchmarks.build("toy")
    assert bench.config["scale"] == 0.1 and bench.loss_lower_bounds == [pytest.approx(-2.1), -21.0]
    assert bench.method_defaults("famo") == {"gamma": 0.0}
    # research/thesis.md: "Default per dataset 1,500 train / 300 val / 700 test", the noisy half of the labels
    config = benchmarks.build("hypercleaning").config
    assert (config["n_train"], config["n_val"], config["n_test"]) == (1500, 300, 700)


# -- the switches the deviation table names change what it says they change -------------------------------

def test_named_switches_act_as_documented():
    import torch

    # nashmtl: no clipping by default (the paper); `max_norm=1.0` clips the shared parameters only (official)
    assert methods.build("nashmtl", 2).shared_grad_max_norm() is None
    assert methods.build("nashmtl", 2, max_norm=1.0).shared_grad_max_norm() == 1.0
    # cagrad: `rescale=1` is the official d / (1 + c²) of the default's d (Algorithm 1)
    grads = torch.tensor([[1.0, 0.2, -0.3], [-0.4, 1.0, 0.5]], dtype=torch.float64)
    losses = torch.ones(2, dtype=torch.float64)
    plain = methods.build("cagrad", 2).combine(grads, losses)
    official = methods.build("cagrad", 2, rescale=1).combine(grads, losses)
    assert torch.allclose(official, plain / (1 + 0.4 ** 2), rtol=1e-9, atol=1e-12)
    # ldcmtl: `sigma_min`/`sigma_max` clamp each σ_i (official [0.2, 0.8], not renormalised); off by default
    sigmas = []
    for clamp in ({}, {"sigma_min": 0.2, "sigma_max": 0.8}):
        method = methods.build("ldcmtl", 2, router="vector", **clamp)
        with torch.no_grad():
            method.router.logits.copy_(torch.tensor([5.0, 0.0]))
        sigmas.append(method.weights(losses.float()))
    assert torch.allclose(sigmas[0], torch.softmax(torch.tensor([5.0, 0.0]), 0))
    assert torch.allclose(sigmas[1], torch.tensor([0.8, 0.2]))


def test_methods_the_scale_rule_names_are_convex_combinations():
    text = (DOCS / "methods/index.md").read_text()
    named = re.search(r"weights sum to 1 \(([^)]*)\) has\s+`natural_scale = \"mean\"`", text)
    assert named, "methods/index.md no longer states the scale rule with its examples"
    names = [_method_name(n.strip()) for n in named.group(1).split(",") if n.strip() not in ("…", "...")]
    assert len(names) >= 6
    assert {n: methods.get(n).natural_scale for n in names} == {n: "mean" for n in names}


def test_thesis_recipes_are_the_documented_ones():
    """research/thesis.md "Recipes": the Office benchmarks carry the thesis' ω optimiser, NYUv2 and QM9 the
    shared recipes."""
    for name in ("office31", "officehome"):
        recipe = benchmarks.get(name).train_defaults
        assert {k: recipe[k] for k in ("lr", "weight_decay", "batch_size", "epochs", "optimizer")} == {
            "lr": 1e-4, "weight_decay": 1e-5, "batch_size": 64, "epochs": 100, "optimizer": "adam"}
    assert benchmarks.get("nyuv2").train_defaults["batch_size"] == 2
    assert benchmarks.get("nyuv2").train_defaults.get("weight_decay", 0.0) == 0.0
    assert benchmarks.get("qm9").train_defaults["batch_size"] == 120
