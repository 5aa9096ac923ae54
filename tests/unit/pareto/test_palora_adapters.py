"""PaLoRA's adapters (Eq. 2): the layer output, merging into a plain network, parameter counts."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from mtlflow import benchmarks
from mtlflow.core.errors import InvalidParameterError
from mtlflow.models.base import MultiTaskModel
from mtlflow.pareto.adapters import AdapterSpec, PreferenceAdapters, factor_shapes, parameter_overhead, select_layers


def _randomise(adapters: PreferenceAdapters, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for delta in adapters.deltas.values():
            delta.A.copy_(torch.randn(delta.A.shape, generator=gen) * 0.3)


def _multimnist_model():
    torch.manual_seed(0)
    return benchmarks.build("multimnist").make_model()


def test_linear_layer_computes_eq2():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4))
    holder = nn.Module()
    holder.trunk = model
    adapters = PreferenceAdapters.inject(holder, n_tasks=3, rank=2, alpha=5.0, layers="trunk")
    _randomise(adapters)
    delta = adapters.deltas["trunk.0"]
    base = model[0].parametrizations.weight.original.detach()
    lam = torch.tensor([0.2, 0.5, 0.3])
    x = torch.randn(7, 6)
    # y' = (W + (α/r) Σ_t λ_t A_t B_t) x + b with A_t ∈ R^{n×r}, B_t ∈ R^{r×m}
    w = base + (5.0 / 2) * sum(lam[t] * delta.A[t] @ delta.B[t] for t in range(3))
    with adapters.preference(lam):
        out = model(x)
    assert delta.A.shape == (3, 4, 2) and delta.B.shape == (3, 2, 6)
    assert torch.allclose(out, x @ w.T + model[0].bias, atol=1e-6)
    assert torch.equal(adapters.state.value, adapters.centre)  # the block restored the previous preference


@pytest.mark.parametrize("factorization", ["matrix", "kernel"])
def test_conv_layer_computes_eq2_in_both_factorisations(factorization):
    torch.manual_seed(1)
    holder = nn.Module()
    holder.trunk = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1))
    adapters = PreferenceAdapters.inject(holder, n_tasks=2, rank=1, alpha=2.0, factorization=factorization)
    _randomise(adapters, 3)
    delta = adapters.deltas["trunk.0"]
    conv = holder.trunk[0]
    base = conv.parametrizations.weight.original.detach()
    lam = torch.tensor([0.7, 0.3])
    products = [delta.A[t] @ delta.B[t] for t in range(2)]
    w = base + 2.0 * sum(lam[t] * products[t].reshape(base.shape) for t in range(2))
    x = torch.randn(2, 3, 8, 8)
    with adapters.preference(lam):
        out = conv(x)
    assert torch.allclose(out, F.conv2d(x, w, conv.bias, padding=1), atol=1e-5)
    expected = (5, 1), (1, 27)  # matrix: n × r and r × c·k²
    if factorization == "kernel":
        expected = (15, 3), (3, 9)  # kernel: nk × rk and rk × ck
    assert (tuple(delta.A.shape[1:]), tuple(delta.B.shape[1:])) == expected


def test_adapters_start_as_the_base_network_for_every_preference():
    model = _multimnist_model()
    x = torch.rand(4, 1, 36, 36)
    with torch.no_grad():
        before = model(x)
        adapters = PreferenceAdapters.inject(model, 2, 1, 5.0)
        for lam in ([1.0, 0.0], [0.0, 1.0], [0.5, 0.5]):
            with adapters.preference(lam):
                assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model(x), before, strict=True))


def test_merged_state_dict_is_the_plain_network_of_that_preference():
    bench = benchmarks.build("multimnist")
    model = _multimnist_model()
    adapters = PreferenceAdapters.inject(model, 2, 1, 5.0)
    _randomise(adapters)
    x = torch.rand(5, 1, 36, 36)
    model.eval()
    for lam in ([0.0, 1.0], [0.3, 0.7], [-1.0, 1.0]):  # pseudo-preferences outside Δ (Sec. 6.2) merge too
        plain = bench.make_model()
        plain.load_state_dict(adapters.merged_state_dict(lam))  # strict: no adapter entry is left
        plain.eval()
        with torch.no_grad(), adapters.preference(lam):
            adapted = model(x)
            merged = plain(x)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(adapted, merged, strict=True))
        assert not any("parametrizations" in k for k in plain.state_dict())
    with pytest.raises(InvalidParameterError, match="2 finite numbers"):
        adapters.merged_state_dict([0.5])


def test_default_layers_are_the_trunks_conv_and_linear_layers():
    model = _multimnist_model()
    adapters = PreferenceAdapters.inject(model, 2, 1, 1.0)
    assert sorted(adapters.deltas) == ["trunk.conv.0", "trunk.conv.3", "trunk.fc.1"]
    assert not any(torch.nn.utils.parametrize.is_parametrized(m) for m in model.heads.modules())
    everything = PreferenceAdapters.inject(_multimnist_model(), 2, 1, 1.0, layers="all")
    assert len(everything.deltas) == 3 + 2 * 2  # trunk + two Linear layers per head
    assert list(PreferenceAdapters.inject(_multimnist_model(), 2, 1, 1.0, layers="trunk.fc").deltas) == ["trunk.fc.1"]
    with pytest.raises(InvalidParameterError, match="match no Conv2d/Linear layer"):
        PreferenceAdapters.inject(_multimnist_model(), 2, 1, 1.0, layers="trunk.nope")


@pytest.mark.parametrize("factorization", ["matrix", "kernel"])
def test_parameter_count_follows_sec_4_1(factorization):
    model = _multimnist_model()
    report = parameter_overhead(model, n_tasks=2, rank=2, layers="all", factorization=factorization)
    adapters = PreferenceAdapters.inject(model, 2, 2, 1.0, layers="all", factorization=factorization)
    assert report["adapter_parameters"] == sum(p.numel() for p in adapters.parameters())
    assert (report["n_tasks"], report["rank"], report["factorization"]) == (2, 2, factorization)
    for row in report["layers"]:
        module = adapters.model.get_submodule(row["layer"])
        # the row describes the original layer: its class and its weight's n x m elements
        assert row["type"] == ("Conv2d" if isinstance(module, nn.Conv2d) else "Linear")
        assert row["base"] == row["n"] * row["m"] == module.weight.numel()
        k = module.kernel_size[0] if isinstance(module, nn.Conv2d) and factorization == "kernel" else 1
        n, c = row["n"], row["m"] // (k * k)
        assert row["adapters"] == 2 * 2 * k * k * (n + c)  # matrix: T·r·(m + n); kernel: T·r·k²(n + c)
    adapted = sum(row["base"] for row in report["layers"])
    assert report["adapted_weight_parameters"] == adapted
    assert report["model_parameters"] == sum(p.numel() for p in _multimnist_model().parameters())
    assert report["adapted_weights_overhead_percent"] == 100.0 * report["adapter_parameters"] / adapted


def test_the_adapter_spec_of_a_saved_model_reads_back_as_written():
    spec = AdapterSpec(3, 4, 2.0, ("trunk.conv.0", "trunk.fc.1"), "kernel")
    assert AdapterSpec.from_dict(spec.to_dict()) == spec
    # models saved before the factorisation was recorded had matrix adapters
    legacy = {key: value for key, value in spec.to_dict().items() if key != "factorization"}
    assert AdapterSpec.from_dict(legacy).factorization == "matrix"


def test_the_adapter_spec_is_plain_json_with_the_layers_as_a_list():
    spec = AdapterSpec(2, 1, 5.0, ("trunk.0",), "matrix")
    assert json.loads(json.dumps(spec.to_dict())) == {"n_tasks": 2, "rank": 1, "alpha": 5.0, "layers": ["trunk.0"],
                                                      "factorization": "matrix"}


def _holder(*layers: nn.Module) -> nn.Module:
    holder = nn.Module()
    holder.trunk = nn.Sequential(*layers)
    return holder


def test_adapters_of_a_float64_model_are_float64_and_keep_the_preference_s_digits():
    torch.manual_seed(2)
    holder = _holder(nn.Linear(5, 3)).double()
    adapters = PreferenceAdapters.inject(holder, n_tasks=3, rank=2, alpha=4.0)
    assert all(p.dtype == torch.float64 for p in adapters.parameters())
    assert adapters.centre.dtype == torch.float64 and torch.equal(adapters.centre, torch.full((3,), 1 / 3,
                                                                                           dtype=torch.float64))
    _randomise(adapters)
    lam = [0.1, 0.2, 0.7]  # 0.1 and 0.7 are not float32 numbers: a float32 detour shows at 1e-9
    adapters.set_preference(lam)
    assert torch.equal(adapters.state.value, torch.tensor(lam, dtype=torch.float64))
    delta, linear = adapters.deltas["trunk.0"], holder.trunk[0]
    base = linear.parametrizations.weight.original.detach()
    expected = base + 2.0 * sum(lam[t] * delta.A[t].detach() @ delta.B[t].detach() for t in range(3))
    assert torch.allclose(adapters.merged_state_dict(lam)["trunk.0.weight"], expected, rtol=0, atol=1e-15)
    with adapters.preference(adapters.centre):
        x = torch.randn(4, 5, dtype=torch.float64)
        centred = base + 2.0 * sum(delta.A[t].detach() @ delta.B[t].detach() for t in range(3)) / 3
        assert torch.allclose(linear(x), x @ centred.T + linear.bias, rtol=0, atol=1e-14)


def test_adapters_follow_the_model_when_it_is_cast_after_injection():
    torch.manual_seed(3)
    holder = _holder(nn.Linear(4, 2))
    adapters = PreferenceAdapters.inject(holder, n_tasks=2, rank=1, alpha=1.0)
    _randomise(adapters)
    holder.double()  # the preference stays float32: each layer reads it in its own dtype
    delta, linear = adapters.deltas["trunk.0"], holder.trunk[0]
    x = torch.randn(3, 4, dtype=torch.float64)
    with adapters.preference([0.25, 0.75]):
        out = linear(x)
    w = linear.parametrizations.weight.original.detach() + (0.25 * delta.A[0] @ delta.B[0]
                                                            + 0.75 * delta.A[1] @ delta.B[1]).detach()
    assert out.dtype == torch.float64 and torch.allclose(out, x @ w.T + linear.bias, rtol=0, atol=1e-12)


def test_the_input_side_factor_is_lora_s_kaiming_uniform_bounded_by_one_over_root_fan_in():
    torch.manual_seed(4)
    fan_in = 64
    holder = _holder(nn.Linear(fan_in, 32))
    adapters = PreferenceAdapters.inject(holder, n_tasks=3, rank=8, alpha=1.0)
    down = adapters.deltas["trunk.0"].B.detach()
    # kaiming_uniform_ with a = √5: gain √(2 / (1 + 5)), bound gain·√(3 / fan_in) = 1/√fan_in. 1,536 uniform
    # draws reach above 0.97 of the bound with probability 1 - 0.97^1536 ≈ 1; a = √6 gives a bound of 0.926,
    # the ReLU gain (a = 0) √6 ≈ 2.45 times it.
    bound = 1 / math.sqrt(fan_in)
    assert down.abs().max() <= bound and down.abs().max() > 0.97 * bound
    assert torch.equal(adapters.deltas["trunk.0"].A, torch.zeros(3, 32, 8))


def test_adapters_refuse_a_weight_already_parametrised_but_not_a_parametrised_bias():
    class Halve(nn.Module):
        def forward(self, value):
            return value / 2

    stacked = _holder(nn.Linear(3, 2))
    PreferenceAdapters.inject(stacked, 2, 1, 1.0)
    with pytest.raises(InvalidParameterError) as error:
        PreferenceAdapters.inject(stacked, 2, 1, 1.0)
    assert str(error.value) == ("layer trunk.0 already has a weight parametrisation; PaLoRA adapters cannot be "
                                "stacked on it")
    with_bias = _holder(nn.Linear(3, 2))
    parametrize.register_parametrization(with_bias.trunk[0], "bias", Halve())
    adapters = PreferenceAdapters.inject(with_bias, 2, 1, 1.0)
    assert list(adapters.deltas) == ["trunk.0"]


@pytest.mark.parametrize("preference, shown", [([0.2, 0.3, 0.5], "[0.2, 0.3, 0.5]"),
                                               ([0.5, float("nan")], "[0.5, nan]")])
def test_a_preference_that_is_not_one_finite_number_per_task_is_refused_with_its_values(preference, shown):
    adapters = PreferenceAdapters.inject(_holder(nn.Linear(3, 2)), 2, 1, 1.0)
    with pytest.raises(InvalidParameterError) as error:
        adapters.set_preference(preference)
    assert str(error.value) == f"a preference must be 2 finite numbers (one per task), got {shown}"


def test_overheads_on_the_benchmarks():
    """Ours (trunk, matrix): 1.96 % on MultiMNIST at r = 1. With heads adapted and LoRA's convolution
    layout the counts equal the paper's: 12.5 % (PaMaL's LeNet, r = 1), 4.2 % / 6.3 % (SegNet, r = 4)."""
    mm = parameter_overhead(benchmarks.build("multimnist").make_model(), 2, 1)
    assert round(mm["overhead_percent"], 2) == 1.96
    pamal = benchmarks.build("multimnist3").make_model(["top_left", "bottom_middle"])
    assert round(parameter_overhead(pamal, 2, 1, "all", "kernel")["overhead_percent"], 2) == 12.50
    city = benchmarks.build("cityscapes", model="segnet").make_model()
    assert round(parameter_overhead(city, 2, 4, "all", "kernel")["overhead_percent"], 1) == 4.2
    assert round(parameter_overhead(city, 2, 4)["overhead_percent"], 2) == 2.27
    nyu = benchmarks.build("nyuv2", model="segnet").make_model()
    assert round(parameter_overhead(nyu, 3, 4, "all", "kernel")["overhead_percent"], 1) == 6.3
    assert round(parameter_overhead(nyu, 3, 4)["overhead_percent"], 2) == 3.41


class _Halve(nn.Module):
    def forward(self, value):
        return value / 2


class _PerTaskTrunk(MultiTaskModel):
    """trunk.0 shared, trunk.1.<i> task i's own trunk layer (like SegNet-MTAN's attention masks), one head each."""

    def __init__(self):
        trunk = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))
        super().__init__(trunk, [nn.Linear(4, 1), nn.Linear(4, 1)], ["a", "b"])

    def trunk_task_parameters(self, index):
        return list(self.trunk[1][index].parameters())


def test_layer_selection_by_name_set_or_comma_separated_names():
    model = _PerTaskTrunk()
    # the default "trunk" is the layers every task shares: neither a task's own trunk layers nor the heads
    assert select_layers(model) == ["trunk.0"]
    assert select_layers(model, "all") == ["trunk.0", "trunk.1.0", "trunk.1.1", "heads.0", "heads.1"]
    # names in the model's order, whatever order they are given in; a name selects the layers below it
    assert select_layers(model, " heads.1 , trunk.1") == ["trunk.1.0", "trunk.1.1", "heads.1"]
    plain = nn.Sequential(nn.Linear(3, 2))
    assert select_layers(plain, "all") == ["0"]
    with pytest.raises(InvalidParameterError) as error:
        select_layers(plain, "trunk")
    assert str(error.value) == ("the model has no shared `trunk` module to put adapters on; give layers=all or "
                                "module names")
    # one name that matches nothing is refused even when the others match, naming it and the valid names
    with pytest.raises(InvalidParameterError) as error:
        select_layers(model, "heads.0, nope, gone")
    assert str(error.value) == ("layers 'nope, gone' match no Conv2d/Linear layer; valid: trunk, all, or names "
                                "among trunk.0, trunk.1.0, trunk.1.1, heads.0, heads.1")
    with pytest.raises(InvalidParameterError) as error:
        select_layers(nn.Sequential(nn.ReLU()), "all")
    assert str(error.value) == "layers 'all' match no Conv2d/Linear layer; valid: trunk, all, or names among none"


def test_a_task_s_own_trunk_layer_stays_out_of_the_trunk_when_parametrised():
    # ownership is read from the stored parameter: a parametrised weight is computed on access, the
    # parametrisation's `original` is what trunk_task_parameters lists
    model = _PerTaskTrunk()
    parametrize.register_parametrization(model.trunk[1][0], "weight", _Halve())
    parametrize.register_parametrization(model.trunk[1][1], "bias", _Halve())  # weight left plain
    parametrize.register_parametrization(model.trunk[0], "weight", _Halve())
    assert select_layers(model, "trunk") == ["trunk.0"]


def test_factor_shapes_default_to_the_matrix_factorisation():
    # A_t ∈ R^{n×r}, B_t ∈ R^{r×m} for a Linear(m=6 -> n=4) at r = 2
    assert factor_shapes(nn.Linear(6, 4), 2) == ((4, 2), (2, 6))


def test_kernel_factorisation_of_a_non_square_kernel_is_refused_with_the_alternative():
    with pytest.raises(InvalidParameterError) as error:
        factor_shapes(nn.Conv2d(3, 5, (3, 1)), 1, "kernel")
    assert str(error.value) == ("factorization 'kernel' needs square kernels, Conv2d(3, 5, kernel_size=(3, 1), "
                                "stride=(1, 1)) has 3x1; use factorization=matrix")


def test_an_unknown_factorisation_is_refused_with_the_valid_ones():
    with pytest.raises(InvalidParameterError) as error:
        factor_shapes(nn.Linear(3, 2), 1, "tucker")
    assert str(error.value) == "unknown adapter factorization 'tucker'; valid: matrix, kernel"
