"""Replay buffers: proportional sampling matches the priorities, importance weights, priority
updates, FIFO eviction, memory, checkpoints, and n-step folding against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from daskrl.algos.nstep import concat_steps, nstep_transitions
from daskrl.algos.replay_buffers import PrioritizedReplay, ReplayBuffer, transition_nbytes
from daskrl.algos.replay_shards import merge_samples, reshard
from daskrl.algos.sum_tree import SumTree


def _chi2_pvalue(indices: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(indices, minlength=len(probs))
    return float(stats.chisquare(counts, probs * len(indices)).pvalue)


def test_prioritized_sampling_matches_priorities():
    rng = np.random.default_rng(3)
    priorities = rng.gamma(0.5, 2.0, 200) + 0.01
    buf = PrioritizedReplay(200, alpha=0.6, seed=1)
    buf.add({"obs": np.arange(200.0)[:, None]}, priorities)
    sample = buf.sample(200_000)
    expected = (priorities + buf.eps) ** 0.6
    expected /= expected.sum()
    assert _chi2_pvalue(sample["indices"], expected) > 1e-3
    # the same sample is far from what alpha=1 (or uniform) would give: the test can fail
    assert _chi2_pvalue(sample["indices"], priorities / priorities.sum()) < 1e-6
    assert (sample["obs"][:, 0] == sample["indices"]).all()


def test_importance_weights_follow_the_sampling_probabilities():
    buf = PrioritizedReplay(4, alpha=1.0, seed=0)
    buf.add({"x": np.zeros(4)}, np.array([1.0, 2.0, 3.0, 4.0]))
    s = buf.sample(64, beta=0.5)
    probs = (np.array([1.0, 2.0, 3.0, 4.0]) + buf.eps)[s["indices"]] / (10 + 4 * buf.eps)
    w = (4 * probs) ** -0.5
    np.testing.assert_allclose(s["weights"], w / w.max(), rtol=1e-5)
    assert s["weights"].max() == pytest.approx(1.0)


def test_priority_updates_change_what_is_sampled():
    buf = PrioritizedReplay(100, alpha=1.0, seed=0)
    buf.add({"x": np.arange(100.0)})
    assert len(set(buf.sample(5000)["indices"].tolist())) > 90  # new ones: the max priority
    buf.update_priorities(np.arange(100), np.zeros(100))
    buf.update_priorities(np.array([7, 42]), np.array([1.0, 3.0]))
    idx = buf.sample(20_000)["indices"]
    assert set(idx.tolist()) <= {7, 42} | set(range(100))
    assert np.mean(idx == 42) == pytest.approx(0.75, abs=0.02)
    assert buf.max_priority == 3.0


def test_fifo_eviction_overwrites_the_oldest():
    buf = PrioritizedReplay(5, seed=0)
    for start in range(0, 12, 3):
        buf.add({"x": np.arange(start, start + 3, dtype=np.float32)})
    assert len(buf) == 5 and buf.added == 12
    assert sorted(buf.data["x"].tolist()) == [7, 8, 9, 10, 11]
    assert set(buf.sample(500)["x"].tolist()) == {7, 8, 9, 10, 11}
    uniform = ReplayBuffer(3)
    uniform.add({"x": np.arange(10.0)})  # more than the capacity at once: the newest stay
    assert sorted(uniform.data["x"].tolist()) == [7, 8, 9]


def test_sumtree_stays_exact_after_many_updates():
    tree = SumTree(1000)
    rng = np.random.default_rng(0)
    for _ in range(200):
        idx = rng.integers(0, 1000, 64)
        tree.set(idx, rng.random(64))
    leaves = tree.leaves(np.arange(1000))
    assert tree.total == pytest.approx(leaves.sum(), rel=1e-12)
    assert (tree.find(np.full(10, tree.total * (1 - 1e-16))) < 1000).all()


def test_state_dict_round_trip_gives_the_same_samples():
    buf = PrioritizedReplay(50, seed=4)
    buf.add({"x": np.arange(30.0)}, np.linspace(0.1, 2, 30))
    copy = PrioritizedReplay(50, seed=99)
    copy.load_state_dict(buf.state_dict())
    a, b = buf.sample(100), copy.sample(100)
    np.testing.assert_array_equal(a["indices"], b["indices"])
    np.testing.assert_array_equal(a["weights"], b["weights"])
    with pytest.raises(ValueError, match="--buffer-size"):
        PrioritizedReplay(10).load_state_dict(buf.state_dict())


def test_merged_shards_sample_as_one_buffer():
    rng = np.random.default_rng(0)
    p = rng.random(60) + 0.05
    one = PrioritizedReplay(60, alpha=1.0, seed=0)
    one.add({"x": np.arange(60.0)}, p)
    shards = [PrioritizedReplay(30, alpha=1.0, seed=s) for s in (1, 2)]
    shards[0].add({"x": np.arange(30.0)}, p[:30])
    shards[1].add({"x": np.arange(30.0, 60.0)}, p[30:])
    merged, used = merge_samples([s.sample(100_000) for s in shards], 100_000, 0.4, rng)
    expected = (p + one.eps) / (p + one.eps).sum()
    assert _chi2_pvalue(merged["x"].astype(int), expected) > 1e-3
    probs = expected[merged["x"].astype(int)]
    w = (60 * probs) ** -0.4
    np.testing.assert_allclose(merged["weights"], w / w.max(), rtol=1e-4)
    assert [len(u) for u in used] == np.bincount(merged["shards"]).tolist()


def _reference_nstep(rew, term, done, valid, n, gamma):
    """One env, a plain loop: (start, return, discount, end) of every transition."""
    out = []
    for t in range(len(rew)):
        if not valid[t]:
            continue
        g, k = 0.0, 0
        while True:
            g += gamma ** k * rew[t + k]
            if done[t + k] or k + 1 == n:
                break
            k += 1
            if t + k >= len(rew):
                g = None
                break
        if g is None:
            continue
        end = t + k
        out.append((t, g, 0.0 if term[end] else gamma ** (k + 1), end))
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_matches_a_plain_loop_across_rollout_boundaries(n):
    rng = np.random.default_rng(n)
    T, E, gamma = 60, 3, 0.9
    term = rng.random((T, E)) < 0.08
    trunc = rng.random((T, E)) < 0.04
    done = term | trunc
    valid = np.ones((T, E), bool)
    valid[1:] = ~done[:-1]  # the step after an episode ends is a reset step
    steps = {"obs": np.broadcast_to(np.arange(T)[:, None, None], (T, E, 1)).astype(np.float32),
             "actions": np.zeros((T, E), np.int64), "rewards": rng.normal(size=(T, E)),
             "next_obs": np.broadcast_to(np.arange(1, T + 1)[:, None, None], (T, E, 1)).astype(
                 np.float32),
             "terminated": term, "done": done, "pending": valid}
    got, keep = [], None
    for lo in range(0, T, 7):  # rollouts of 7 steps, the unfinished ones carried over
        chunk = concat_steps(keep, {k: v[lo:lo + 7] for k, v in steps.items()})
        out, keep = nstep_transitions(chunk, n, gamma)
        got.append(out)
    rows = {k: np.concatenate([g[k] for g in got]) for k in got[0]}
    ref = [(e, *r) for e in range(E) for r in _reference_nstep(
        steps["rewards"][:, e], term[:, e], done[:, e], valid[:, e], n, gamma)]
    assert len(rows["rewards"]) == len(ref)
    # match by (start step, end step): obs encodes the start, next_obs the end + 1
    mine = sorted(zip(rows["obs"][:, 0].astype(int), (rows["next_obs"][:, 0] - 1).astype(int),
                      np.round(rows["rewards"], 4), np.round(rows["discounts"], 4),
                      strict=True))
    theirs = sorted((t, end, round(g, 4), round(d, 4)) for _, t, g, d, end in ref)
    assert [m[:2] for m in mine] == [t[:2] for t in theirs]
    np.testing.assert_allclose([m[2] for m in mine], [t[2] for t in theirs], atol=2e-4)
    np.testing.assert_allclose([m[3] for m in mine], [t[3] for t in theirs], atol=1e-4)


def test_one_million_cartpole_transitions_fit_in_100_mib():
    per = transition_nbytes((4,), np.float32, (), np.int64, prioritized=True)
    buf = PrioritizedReplay(1_000_000)
    buf.add({"obs": np.zeros((1, 4), np.float32), "actions": np.zeros(1, np.int64),
             "rewards": np.zeros(1, np.float32), "next_obs": np.zeros((1, 4), np.float32),
             "discounts": np.zeros(1, np.float32)})
    assert buf.nbytes <= 100 * 2**20
    assert buf.nbytes <= per * 2**20 * 1.05  # the estimate the memory check uses holds


def test_sampling_an_empty_buffer_names_learning_starts():
    with pytest.raises(ValueError, match="--learning-starts"):
        PrioritizedReplay(4).sample(2)


def test_reshard_deals_every_saved_transition_with_its_priority():
    """Three saved shards (one wrapped past its capacity) dealt over two: every transition
    lands once with its priority, oldest first in each new shard; a smaller capacity keeps the
    newest, as FIFO eviction would."""
    rng = np.random.default_rng(0)
    shards = [PrioritizedReplay(6, alpha=1.0, seed=j) for j in range(3)]
    for j, buf in enumerate(shards):
        x = 100.0 * j + np.arange(9 if j == 0 else 4)
        for part in (x[:4], x[4:]):  # shard 0 wraps: its rows 0-2 hold the newest
            if len(part):
                buf.add({"x": part}, rng.random(len(part)) + 0.1)
    assert shards[0].data["x"][:3].tolist() == [6.0, 7.0, 8.0]
    saved = [b.state_dict() for b in shards]
    prio = {float(x): float(p) for b in shards for x, p in
            zip(b.data["x"][:len(b)], b.tree.leaves(np.arange(len(b))), strict=True)}
    new = [PrioritizedReplay(16, alpha=1.0, seed=9) for _ in range(2)]
    for j, buf in enumerate(new):
        buf.load_state_dict(reshard(saved, 2, j, 16))
    got = [float(x) for b in new for x in b.data["x"][:len(b)]]
    assert sorted(got) == sorted(prio)  # every saved transition, once
    for b in new:
        assert b.tree.total == pytest.approx(sum(prio[float(x)] for x in b.data["x"][:len(b)]))
    assert new[0].data["x"][:3].tolist() == [3.0, 5.0, 7.0]  # shard 0 oldest first, dealt
    small = PrioritizedReplay(2, alpha=1.0)
    small.load_state_dict(reshard(saved, 1, 0, 2))
    assert sorted(small.data["x"].tolist()) == [202.0, 203.0]  # the newest kept
