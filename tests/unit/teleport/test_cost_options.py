"""COST options: how the variants' defaults resolve, which values are accepted at the boundaries, and the
one-line refusals word for word (the messages are part of the contract: bad input gets one clear line)."""

from __future__ import annotations

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.teleport import build
from mtlflow.teleport.options import CostOptions


def refusal(options) -> str:
    with pytest.raises(InvalidParameterError) as error:
        CostOptions.from_mapping(options)
    return str(error.value)


def test_unknown_options_are_named_with_every_valid_option_sorted():
    assert refusal({"bogus": 1, "aa": 2}) == (
        "unknown COST option(s) aa, bogus; valid: adapter, balance, batch_size, batches, check_every, delay_epochs, "
        "eval_mode, gamma, htr, htr_bias_correction, htr_nonpositive, htr_reference, invariance_target, invariance_weight, lr, max_per_epoch, noise, passes, "
        "perturbations, radius, rank, reduction, sharpness_gradient, steps, trigger, use_invariance, use_sharpness, "
        "variant")


def test_htr_nonpositive_is_one_of_its_choices():
    assert CostOptions.from_mapping({}).resolved().htr_nonpositive == "restart"
    assert CostOptions.from_mapping({}).resolved().htr_bias_correction == "rescale"
    assert CostOptions.from_mapping({"variant": "released"}).resolved().htr_bias_correction == "none"
    assert refusal({"htr_bias_correction": "pytorch"}) == (
        "COST option htr_bias_correction must be one of rescale, none, got 'pytorch'")
    assert refusal({"htr_nonpositive": "clamp"}) == (
        "COST option htr_nonpositive must be one of restart, zero-betas, got 'clamp'")


def test_unknown_variant_is_refused_with_the_valid_variants():
    assert refusal({"variant": "v2"}) == "COST variant must be one of paper, released, got 'v2'"


def test_explicit_steps_replace_the_released_variants_passes():
    # released trains for passes = 2 over the training set; an explicit step count must win, not be ignored
    # (the callback runs `passes x batches` steps whenever passes is set)
    resolved = CostOptions.from_mapping({"variant": "released", "steps": 5}).resolved()
    assert (resolved.steps, resolved.passes) == (5, None)
    assert CostOptions.from_mapping({"variant": "released"}).resolved().passes == 2


def test_a_single_pass_is_the_smallest_accepted_pass_count():
    assert CostOptions.from_mapping({"variant": "released", "passes": 1}).resolved().passes == 1
    assert refusal({"variant": "released", "passes": 0}) == "COST option passes must be an integer >= 1, got 0"


def test_gamma_zero_is_accepted_and_a_negative_gamma_is_refused_as_not_non_negative():
    # gamma weighs L_g in L_t - gamma L_g (Eq. 11): 0 switches the sharpness term off, so it is valid
    assert CostOptions.from_mapping({"gamma": 0.0}).resolved().gamma == 0.0
    assert refusal({"gamma": -0.1}) == "COST option gamma must be a non-negative finite number, got -0.1"


def test_zero_radius_and_zero_lr_are_refused_as_not_positive():
    # unlike gamma, δ = 0 would perturb nothing (L_g = 0) and a zero learning rate would never move the adapter
    assert refusal({"radius": 0}) == "COST option radius must be a positive finite number, got 0"
    assert refusal({"lr": 0.0}) == "COST option lr must be a positive finite number, got 0.0"


@pytest.mark.parametrize("rank", [2.5, True])
def test_an_integer_option_refuses_a_float_and_a_bool_that_clear_its_lower_bound(rank):
    # 2.5 >= 1 and True == 1 >= 1: only the type rules them out
    assert refusal({"rank": rank}) == f"COST option rank must be an integer >= 1, got {rank!r}"


@pytest.mark.parametrize("options, message", [
    ({"sharpness_gradient": "both"},
     "sharpness_gradient must be one of through-perturbations, unperturbed-only, got 'both'"),
    ({"invariance_target": "epoch"}, "invariance_target must be one of batch, mean, got 'epoch'"),
    ({"adapter": "lokr"}, "adapter must be one of lora, loha, oft, got 'lokr'"),
    ({"max_per_epoch": -1}, "max_per_epoch must be an integer >= 0, got -1"),
    ({"batch_size": -1}, "batch_size must be an integer >= 0, got -1"),
    ({"perturbations": 0}, "perturbations must be an integer >= 1, got 0"),
    ({"steps": 0}, "steps must be an integer >= 1, got 0"),
    ({"invariance_weight": -1.0}, "invariance_weight must be a non-negative finite number, got -1.0"),
    ({"htr": "yes"}, "htr must be true or false, got 'yes'"),
    ({"balance": "uniform"}, "balance must be one of softmax, complement, got 'uniform'"),
    ({"noise": "gaussian"}, "noise must be one of sphere, per-tensor, got 'gaussian'"),
    ({"reduction": "sum"}, "reduction must be one of max-of-mean, mean-of-max, got 'sum'"),
    ({"htr_reference": "none"}, "htr_reference must be one of mean-gradient, last-update, got 'none'"),
    ({"delay_epochs": -1}, "delay_epochs must be an integer >= 0, got -1"),
    ({"check_every": 0}, "check_every must be an integer >= 1, got 0"),
    ({"radius": float("inf")}, "radius must be a positive finite number, got inf"),
    ({"gamma": "big"}, "gamma must be a non-negative finite number, got 'big'"),
    ({"trigger": "sometimes"}, "trigger must be one of dominated, weak, many-task, released, always, got 'sometimes'"),
    ({"batches": -1}, "batches must be an integer >= 0, got -1"),
    ({"variant": "released", "passes": 0}, "passes must be an integer >= 1, got 0"),
    ({"lr": 0.0}, "lr must be a positive finite number, got 0.0"),
    ({"eval_mode": 1}, "eval_mode must be true or false, got 1"),
    ({"use_invariance": "no"}, "use_invariance must be true or false, got 'no'"),
    ({"use_invariance": False, "use_sharpness": False},
     "use_invariance and use_sharpness cannot both be false: the adapter would have no objective"),
    ({"passes": 2, "steps": 3}, "steps and passes exclude each other; give one (passes x batches = steps)"),
])
def test_a_bad_value_is_refused_naming_the_option_and_the_value(options, message):
    assert refusal(options) == "COST option " + message


def test_build_refuses_options_that_are_not_a_mapping():
    # a list of pairs would otherwise pass through dict() and silently build a teleport
    with pytest.raises(InvalidParameterError) as error:
        build("cost", [("rank", 3)])
    assert str(error.value) == "teleport_options must be a mapping, got [('rank', 3)]"


def test_validate_refuses_options_without_a_teleport_and_an_unknown_teleport_in_one_line():
    from mtlflow.teleport import validate

    for teleport in (None, ""):
        validate(teleport, None)  # no teleport, no options: nothing to check
        with pytest.raises(InvalidParameterError) as error:
            validate(teleport, {"trigger": "weak"})
        assert str(error.value) == "teleport_options given without a teleport; add --teleport cost or drop them"
    with pytest.raises(InvalidParameterError) as error:
        validate("warp", None)
    assert str(error.value) == "unknown teleport 'warp'; valid teleports: cost"


def test_the_dry_check_refuses_a_single_task_and_oft_on_the_benchmarks_conv_trunk():
    # the job's check before any data work (mtlflow.jobs.plan), on MultiMNIST's LeNet (two Conv2d trunk layers)
    from mtlflow import benchmarks
    from mtlflow.teleport import check_benchmark

    bench = benchmarks.build("multimnist")
    check_benchmark(bench, ["left", "right"], None, None)
    check_benchmark(bench, ["left", "right"], "cost", {"adapter": "lora"})
    with pytest.raises(InvalidParameterError) as error:
        check_benchmark(bench, ["left"], "cost", None)
    assert str(error.value) == ("--teleport cost needs at least 2 tasks (gradient conflicts between tasks trigger it); "
                                "drop --tasks or --teleport")
    with pytest.raises(InvalidParameterError) as error:
        check_benchmark(bench, ["left", "right"], "cost", {"adapter": "oft"})
    assert str(error.value) == ("COST adapter 'oft' is wrong on Conv2d layers in peft 0.21 (its output differs at "
                                "initialisation; trunk layers trunk.conv.0, trunk.conv.3); use adapter=lora or loha")
    with pytest.raises(InvalidParameterError) as error:
        check_benchmark(bench, ["left", "right"], "cost", {"rank": 0})
    assert str(error.value) == "COST option rank must be an integer >= 1, got 0"
    with pytest.raises(InvalidParameterError) as error:
        check_benchmark(bench, ["left", "right"], "cost", [("rank", 3)])
    assert str(error.value) == "teleport_options must be a mapping, got [('rank', 3)]"
