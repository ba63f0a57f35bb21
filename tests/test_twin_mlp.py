"""TwinMLP (actor and critic stepped as one) gives each tower's own output, follows their
weights as they are trained or loaded, and the actor-critics act with it; the categorical
sampler draws from the policy's distribution; the numpy path for small CPU batches is the same
maths and draws as torch's."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from daskrl.algos.categorical import DiscreteActorCritic, sample, sample_numpy
from daskrl.algos.gaussian import GaussianActorCritic
from daskrl.algos.layers import mlp
from daskrl.algos.normalize import Moments, Normalization, RunningMeanStd
from daskrl.algos.twin_mlp import NUMPY_MAX_ROWS, TwinMLP


@pytest.mark.parametrize("hidden", [(), (16,), (32, 32), (8, 8, 8)])
@pytest.mark.parametrize("act", [nn.Tanh, nn.ReLU])
def test_matches_each_tower(hidden: tuple[int, ...], act: type[nn.Module]) -> None:
    torch.manual_seed(0)
    a, b = mlp(5, 3, hidden, out_std=1.0), mlp(5, 1, hidden, out_std=1.0)
    for net in (a, b):  # swap the activations in
        for i, m in enumerate(net):
            if isinstance(m, nn.Tanh):
                net[i] = act()
    twin = TwinMLP(a, b)
    x = torch.randn(7, 5)
    with torch.no_grad():
        out_a, out_b = twin(x)
        torch.testing.assert_close(out_a, a(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out_b, b(x), rtol=1e-5, atol=1e-6)
        np_out = twin.run_numpy(a, b, x.numpy())
    assert out_a.shape == (7, 3) and out_b.shape == (7, 1)
    assert np_out is not None
    for got, tower in zip(np_out, (a, b), strict=True):
        assert got.dtype == np.float32
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(got), tower(x), rtol=1e-5, atol=1e-6)


def built_twin() -> tuple[nn.Sequential, nn.Sequential, TwinMLP, torch.Tensor]:
    """Two 16x16 towers, their twin with its stacked copy built, and an input batch."""
    torch.manual_seed(0)
    a, b = mlp(4, 2, (16, 16), out_std=1.0), mlp(4, 1, (16, 16), out_std=1.0)
    twin = TwinMLP(a, b)
    x = torch.randn(6, 4)
    with torch.no_grad():
        twin(x)
    return a, b, twin, x


def assert_numpy_follows(twin: TwinMLP, a: nn.Sequential, b: nn.Sequential,
                         x: torch.Tensor) -> None:
    """``run_numpy`` gives each tower's output (called before the torch path, so that
    its own check of the weights is what rebuilds the copy)."""
    out = twin.run_numpy(a, b, x.numpy())
    assert out is not None
    with torch.no_grad():
        np.testing.assert_allclose(out[0], a(x), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[1], b(x), rtol=1e-5, atol=1e-6)


def test_follows_training_and_loading() -> None:
    a, b, twin, x = built_twin()
    twin.run_numpy(a, b, x.numpy())  # the numpy copy built too
    opt = torch.optim.Adam([*a.parameters(), *b.parameters()], lr=0.1)
    (a(x).sum() + b(x).sum()).backward()
    opt.step()
    assert_numpy_follows(twin, a, b, x)
    with torch.no_grad():
        torch.testing.assert_close(twin(x)[0], a(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(twin(x)[1], b(x), rtol=1e-5, atol=1e-6)
    other = mlp(4, 2, (16, 16), out_std=1.0)
    a.load_state_dict(other.state_dict())  # copied in place
    assert_numpy_follows(twin, a, b, x)
    with torch.no_grad():
        torch.testing.assert_close(twin(x)[0], other(x), rtol=1e-5, atol=1e-6)
    fresh = mlp(4, 1, (16, 16), out_std=1.0)
    state = {k: v.detach().clone() for k, v in fresh.state_dict().items()}
    for key, tensor in state.items():  # the same version counters as those they replace
        for _ in range(b.state_dict()[key]._version):
            tensor.add_(0)
    b.load_state_dict(state, assign=True)  # parameters replaced
    assert_numpy_follows(twin, a, b, x)
    with torch.no_grad():
        torch.testing.assert_close(twin(x)[1], fresh(x), rtol=1e-5, atol=1e-6)


def test_follows_fused_optimiser_steps_and_says_how_to_follow_raw_writes() -> None:
    a, b, twin, x = built_twin()
    # a fused Adam step (the learners' optimiser) leaves the parameters' version counters
    opt = torch.optim.Adam([*a.parameters(), *b.parameters()], lr=0.1, fused=True)
    (a(x).sum() + b(x).sum()).backward()
    opt.step()
    assert_numpy_follows(twin, a, b, x)
    with torch.no_grad():
        torch.testing.assert_close(twin(x)[0], a(x), rtol=1e-5, atol=1e-6)
        a[0].weight.data.mul_(2.0)  # torch does not count writes through .data
        twin.invalidate()
    assert_numpy_follows(twin, a, b, x)
    with torch.no_grad():
        torch.testing.assert_close(twin(x)[0], a(x), rtol=1e-5, atol=1e-6)
        a.double()  # another dtype: the copy follows (the input too)
        torch.testing.assert_close(twin(x.double())[0], a(x.double()), rtol=1e-9, atol=1e-12)


def test_empty_batches_and_replaced_towers() -> None:
    net = DiscreteActorCritic(4, 2, (8, 8))
    logits, value = net.towers(torch.zeros(0, 4))
    assert logits.shape == (0, 2) and value.shape == (0, 1)
    logits, value = net.towers.run_numpy(net.actor, net.critic, np.zeros((0, 4), np.float32))
    assert logits.shape == (0, 2) and value.shape == (0, 1)
    net.critic = mlp(4, 1, (32,), out_std=1.0)  # a subclass's own critic, another shape
    obs = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(net.act(obs.numpy())[2], net.critic(obs).squeeze(-1))


def test_fits_only_same_shaped_mlps() -> None:
    assert TwinMLP.fits(mlp(4, 2, (8, 8), 1.0), mlp(4, 1, (8, 8), 1.0))
    assert not TwinMLP.fits(mlp(4, 2, (8, 8), 1.0), mlp(4, 1, (8,), 1.0))
    assert not TwinMLP.fits(mlp(4, 2, (8,), 1.0), mlp(3, 1, (8,), 1.0))
    assert not TwinMLP.fits(mlp(4, 2, (8,), 1.0), nn.Sequential(nn.Linear(4, 8), nn.ELU(),
                                                                 nn.Linear(8, 1)))
    with pytest.raises(ValueError, match="same layers"):
        TwinMLP(mlp(4, 2, (8,), 1.0), mlp(4, 1, (16,), 1.0))


def test_pickles_without_the_stacked_copy() -> None:
    net = DiscreteActorCritic(4, 2, (8, 8))
    x = np.zeros((3, 4), np.float32)
    net.act(x)
    assert net.towers._cache is not None  # built
    copy = pickle.loads(pickle.dumps(net))
    assert copy.towers._cache is None and copy.towers.a is copy.actor
    a1, lp1, v1 = net.act(x, deterministic=True)
    a2, lp2, v2 = copy.act(x, deterministic=True)
    assert torch.equal(a1, a2) and torch.equal(lp1, lp2) and torch.equal(v1, v2)


def test_discrete_act_agrees_with_evaluate() -> None:
    torch.manual_seed(1)
    net = DiscreteActorCritic(4, 3)
    obs = torch.randn(64, 4)
    actions, logp, value = net.act(obs.numpy(), torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp_eval, _, value_eval = net.evaluate(obs, actions)
    torch.testing.assert_close(logp, logp_eval, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, value_eval, rtol=1e-5, atol=1e-5)


def test_gaussian_act_agrees_with_evaluate() -> None:
    torch.manual_seed(1)
    net = GaussianActorCritic(5, 2, normalization=Normalization(obs=True))
    with torch.no_grad():
        net.actor_logstd.fill_(-0.5)
    obs = torch.randn(64, 5)
    actions, logp, value = net.act(obs.numpy(), torch.Generator().manual_seed(0))
    mean, _ = net.act(obs.numpy(), deterministic=True)[:2]
    with torch.no_grad():
        logp_eval, _, value_eval = net.evaluate(obs, actions)
        expected_mean = net.actor_mean(net.features(obs))
    torch.testing.assert_close(mean, expected_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logp, logp_eval, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(value, value_eval, rtol=1e-5, atol=1e-5)


def test_sample_follows_the_softmax() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7])
    n = 60_000
    actions, logp = sample(probs.log().expand(n, 3), torch.Generator().manual_seed(0))
    freq = torch.bincount(actions, minlength=3).double() / n
    # three standard errors of a binomial share at n = 60k: below 0.006
    assert torch.allclose(freq, probs.double(), atol=0.006), freq
    torch.testing.assert_close(logp, probs.log()[actions])


def test_numpy_path_only_for_its_own_float32_cpu_towers() -> None:
    a, b, twin, x = built_twin()
    other = mlp(4, 1, (16, 16), out_std=1.0)
    assert twin.run_numpy(a, other, x.numpy()) is None  # not its tower: run() handles it
    a.double()
    b.double()
    assert twin.run_numpy(a, b, x.numpy()) is None  # float64 weights: torch's path


def discrete_net() -> DiscreteActorCritic:
    torch.manual_seed(2)
    net = DiscreteActorCritic(4, 3, (32, 32))
    with torch.no_grad():  # logits far from uniform: sampling and log-probs are exercised
        net.actor[-1].weight.mul_(100.0)
    return net


def gaussian_net() -> GaussianActorCritic:
    torch.manual_seed(2)
    net = GaussianActorCritic(5, 2, (32, 32), normalization=Normalization(obs=True))
    assert net.obs_rms is not None
    net.obs_rms.update(Moments.of(np.random.default_rng(0).normal(3.0, 2.0, (100, 5))))
    with torch.no_grad():
        net.actor_logstd.copy_(torch.tensor([[-0.5, 0.3]]))
    return net


def no_call(*_: Any) -> None:
    raise AssertionError("the other path ran")


@pytest.mark.parametrize("make", [discrete_net, gaussian_net])
@pytest.mark.parametrize("deterministic", [False, True])
def test_numpy_act_is_the_torch_act(make: Callable[[], nn.Module], deterministic: bool,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    net = make()
    obs = np.random.default_rng(1).normal(2.0, 3.0, (NUMPY_MAX_ROWS, 5 if make is gaussian_net
                                                                     else 4)).astype(np.float32)
    ref = net._act_torch(obs, torch.Generator().manual_seed(0), deterministic)
    monkeypatch.setattr(net, "_act_torch", no_call)  # act must take the numpy path
    got = net.act(obs, torch.Generator().manual_seed(0), deterministic)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape and g.is_inference()
    if make is discrete_net:
        assert torch.equal(got[0], ref[0])
        assert len(set(got[0].tolist())) > 1  # the draws, not one dominant action
    else:
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=1e-5)


@pytest.fixture
def torch_threads() -> Any:
    """Sets torch's thread count for the test, then puts it back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_the_path_follows_the_rows_and_torch_threads(monkeypatch: pytest.MonkeyPatch,
                                                     torch_threads: Any) -> None:
    net = gaussian_net()
    obs = np.random.default_rng(1).normal(size=(NUMPY_MAX_ROWS + 1, 5)).astype(np.float32)
    torch_threads(1)  # an actor's default: numpy at any size
    monkeypatch.setattr(net, "_act_torch", no_call)
    assert net.act(obs)[0].shape == (NUMPY_MAX_ROWS + 1, 2)
    monkeypatch.undo()
    torch_threads(2)  # threads torch's ops can use: numpy only up to NUMPY_MAX_ROWS
    monkeypatch.setattr(net, "_act_numpy", no_call)
    assert net.act(obs)[0].shape == (NUMPY_MAX_ROWS + 1, 2)
    with pytest.raises(AssertionError, match="the other path ran"):
        net.act(obs[:NUMPY_MAX_ROWS])
    monkeypatch.undo()
    net.double()  # float64 weights: the numpy path declines, torch's runs
    monkeypatch.setattr(net, "_act_torch", no_call)
    with pytest.raises(AssertionError, match="the other path ran"):
        net.act(obs[:4])


def test_numpy_normalisation_is_forward_bit_for_bit() -> None:
    rms = RunningMeanStd((3,), clip=5.0)
    rms.update(Moments.of(np.random.default_rng(0).normal(1.0, 0.1, (50, 3))))
    x = np.random.default_rng(1).normal(1.0, 1.0, (20, 3)).astype(np.float32)
    got = rms.normalize_numpy(x)
    assert np.array_equal(got, rms(torch.from_numpy(x)).numpy())
    assert got.max() == 5.0 and got.min() == -5.0  # clipped as forward clips
    rms.update(Moments.of(np.full((50, 3), 4.0)))  # new statistics: the copy follows
    assert np.array_equal(rms.normalize_numpy(x), rms(torch.from_numpy(x)).numpy())


def test_numpy_sample_follows_the_softmax() -> None:
    probs = np.array([0.1, 0.2, 0.7], np.float32)
    n = 60_000
    logits = np.broadcast_to(np.log(probs), (n, 3)).copy()
    actions, logp = sample_numpy(logits, torch.Generator().manual_seed(0))
    freq = np.bincount(actions, minlength=3) / n
    np.testing.assert_allclose(freq, probs, atol=0.006)  # three standard errors at 60k
    np.testing.assert_allclose(logp, np.log(probs)[actions], rtol=1e-5, atol=1e-6)
