"""Loss weightings in the losses' dtype and on awkward models: RLW's float64 draws, STCH after its (float64)
nadir on float32 losses, UW's float64 objective from a float32 parameter, GradNorm on a last shared layer
with a parameter no loss reaches."""

from __future__ import annotations

import torch
from method_helpers import fake_trainer
from torch import nn

from mtlflow import methods
from mtlflow.models.base import MultiTaskModel

# -- RLW ------------------------------------------------------------------------------------------

def test_rlw_weights_are_the_softmax_of_float64_normal_logits() -> None:
    # K = 40 (CelebA): the CPU generator draws float32 and float64 normals by different algorithms from 16
    # values on, so logits drawn in another dtype are different numbers, not just rounded ones
    k = 40
    rlw = methods.build("rlw", k, 3)
    for _ in range(3):
        stream = torch.Generator()
        stream.set_state(rlw.rng.generator.get_state())   # the method's stream, as it stands before this draw
        expected = torch.softmax(torch.randn(k, generator=stream, dtype=torch.float64), dim=0)
        torch.testing.assert_close(rlw.weights(torch.ones(k, dtype=torch.float64)), expected, rtol=1e-15, atol=0)


# -- STCH -----------------------------------------------------------------------------------------

def test_stch_weights_and_objective_after_the_nadir_are_in_the_float32_losses_dtype() -> None:
    k, mu = 3, 0.5
    stch = methods.build("stch", k, mu=mu, warmup_epochs=0)
    stch.objective(torch.tensor([1.0, 2.0, 4.0]))     # the nadir epoch: one float32 step
    stch.on_epoch_end(1)
    assert stch.nadir.dtype == torch.float64          # the nadir itself is kept in float64
    losses = torch.tensor([1.5, 3.0, 0.6], requires_grad=True)
    objective = stch.objective(losses)
    # closed form in float32: u = log(L / nadir), K μ logsumexp(u / μ), weights K softmax(u / μ) / L
    u = torch.log(losses.detach() / torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(objective.detach(), k * mu * torch.logsumexp(u / mu, dim=0))
    torch.testing.assert_close(stch.last_weights, k * torch.softmax(u / mu, dim=0) / losses.detach())


# -- UW -------------------------------------------------------------------------------------------

def test_uw_objective_on_float64_losses_is_the_float64_formula() -> None:
    uw = methods.build("uw", 2)
    with torch.no_grad():
        uw.log_variances.copy_(torch.tensor([0.3, -0.2]))
    losses = torch.tensor([1.7, 0.45], dtype=torch.float64)
    s = uw.log_variances.detach().double()   # the float32 parameter's exact value
    expected = 0.5 * (torch.exp(-s) * losses + s).sum()
    # e^{-s} in float32 would be off by ~1e-8 relative; the toy runner's float64 losses keep float64
    torch.testing.assert_close(uw.objective(losses).detach(), expected, rtol=1e-14, atol=0)


# -- GradNorm -------------------------------------------------------------------------------------

class LinearWithSpare(nn.Module):
    """A linear layer that also owns a trainable parameter its forward never uses."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.5)
        self.spare = nn.Parameter(torch.ones(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


def test_gradnorm_measures_the_norms_on_the_used_parameters_of_a_last_layer_with_an_unused_one() -> None:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), LinearWithSpare(5, 4))
    model = MultiTaskModel(trunk, [nn.Linear(4, 1) for _ in range(2)], ["t0", "t1"]).double()
    gn = methods.build("gradnorm", 2)
    gn.setup(fake_trainer(model))
    last = model.trunk[2]
    assert [id(p) for p in gn.shared_layer] == [id(last.weight), id(last.spare)]
    x = torch.randn(8, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    losses = torch.stack([(p ** 2).mean() * (1 + i) for i, p in enumerate(model(x))])
    gn.objective(losses)
    # the spare parameter gets no gradient from any loss: G_i is the norm over the used weight alone
    expected = torch.stack([torch.autograd.grad(losses[i], last.weight, retain_graph=True)[0].norm()
                            for i in range(2)])
    torch.testing.assert_close(gn.last_grad_norms, expected, rtol=1e-12, atol=0)
    assert gn.task_weights.grad is not None
