"""Parity of jaxlm's linear-chain CRF with pytorch-crf (torchcrf 0.7.2) and with brute-force enumeration of
every path; BIO constraints; the flax module's parameters."""
from __future__ import annotations

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

torch = pytest.importorskip("torch")
torchcrf = pytest.importorskip("torchcrf")

from jaxlm.models import CRF, crf_decode, crf_log_likelihood  # noqa: E402
from jaxlm.models.crf import DISALLOWED, allowed_transitions, apply_constraints  # noqa: E402

LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def random_case(lengths, num_tags, seed=0):
    """Emissions [B, T, K], valid tags everywhere, the right-padded mask, and transitions, start, end."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    batch, steps = len(lengths), lengths.max()
    emissions = rng.normal(size=(batch, steps, num_tags)).astype(np.float32) * 2
    tags = rng.integers(0, num_tags, size=(batch, steps))
    mask = np.arange(steps)[None, :] < lengths[:, None]
    params = [rng.normal(size=shape).astype(np.float32) for shape in ((num_tags, num_tags), (num_tags,), (num_tags,))]
    return emissions, tags, mask, params


def their_crf(transitions, start, end):
    crf = torchcrf.CRF(len(start), batch_first=True)
    with torch.no_grad():
        crf.transitions.copy_(torch.from_numpy(transitions))
        crf.start_transitions.copy_(torch.from_numpy(start))
        crf.end_transitions.copy_(torch.from_numpy(end))
    return crf


def path_score(emissions, path, transitions, start, end):
    steps = sum(transitions[a, b] for a, b in zip(path, path[1:]))
    return start[path[0]] + sum(emissions[t, tag] for t, tag in enumerate(path)) + steps + end[path[-1]]


def all_paths(emissions, length, params, allowed=lambda path: True):
    """Every path over a sequence's first `length` steps that `allowed` keeps, and their scores (float64)."""
    paths = [p for p in itertools.product(range(emissions.shape[-1]), repeat=length) if allowed(p)]
    scores = np.array([path_score(emissions.astype(np.float64), p, *(q.astype(np.float64) for q in params))
                       for p in paths])
    return paths, scores


def log_sum_exp(x):
    return x.max() + np.log(np.exp(x - x.max()).sum())


def test_log_likelihood_matches_torchcrf_under_jit():
    emissions, tags, mask, params = random_case([7, 1, 4, 7, 2, 5], num_tags=5)
    with torch.no_grad():
        theirs = their_crf(*params)(torch.from_numpy(emissions), torch.from_numpy(tags), torch.from_numpy(mask),
                                    reduction="none").numpy()
    ignored = np.where(mask, tags, -100)
    ours = jax.jit(crf_log_likelihood)(emissions, ignored, mask, *params)
    assert ours.shape == (6,) and ours.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-5)


def test_decode_matches_torchcrf_under_jit():
    emissions, _, mask, params = random_case([7, 1, 4, 7, 2, 5], num_tags=5, seed=1)
    theirs = their_crf(*params).decode(torch.from_numpy(emissions), torch.from_numpy(mask))
    tags, scores = jax.jit(crf_decode)(emissions, mask, *params)
    assert tags.dtype == jnp.int32 and scores.shape == (6,)
    for row, path, on in zip(np.asarray(tags), theirs, mask):
        assert row[on].tolist() == path
        assert (row[~on] == 0).all()


def test_viterbi_and_likelihood_equal_brute_force():
    emissions, tags, mask, params = random_case([4, 1, 3, 2], num_tags=3, seed=2)
    best, best_scores = crf_decode(emissions, mask, *params)
    likelihoods = crf_log_likelihood(emissions, tags, mask, *params)
    for b, length in enumerate(mask.sum(1)):
        paths, scores = all_paths(emissions[b], length, params)
        assert tuple(np.asarray(best[b, :length])) == paths[scores.argmax()]
        np.testing.assert_allclose(float(best_scores[b]), scores.max(), rtol=1e-5)
        gold = path_score(emissions[b], tuple(tags[b, :length]), *params)
        np.testing.assert_allclose(float(likelihoods[b]), gold - log_sum_exp(scores), rtol=1e-5)


def test_gradients_match_torch_autograd():
    emissions, tags, mask, params = random_case([6, 3, 1, 5], num_tags=4, seed=3)
    crf = their_crf(*params)
    their_emissions = torch.from_numpy(emissions).requires_grad_()
    (-crf(their_emissions, torch.from_numpy(tags), torch.from_numpy(mask), reduction="mean")).backward()
    theirs = [their_emissions.grad, crf.transitions.grad, crf.start_transitions.grad, crf.end_transitions.grad]

    def loss(emissions, transitions, start, end):
        return -crf_log_likelihood(emissions, tags, mask, transitions, start, end).mean()
    ours = jax.grad(loss, argnums=(0, 1, 2, 3))(emissions, *params)
    for mine, their in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(mine), their.numpy(), rtol=1e-5, atol=1e-6)


def test_bio_allowed_transitions():
    allowed = allowed_transitions(LABELS)
    assert allowed.transitions.shape == (5, 5)
    may_follow = {label: [LABELS[i] for i in np.flatnonzero(allowed.transitions[:, j])]
                  for j, label in enumerate(LABELS)}
    assert may_follow["I-PER"] == ["B-PER", "I-PER"] and may_follow["I-LOC"] == ["B-LOC", "I-LOC"]
    assert may_follow["O"] == may_follow["B-PER"] == list(LABELS)
    assert allowed.start.tolist() == [True, True, False, True, False] and allowed.end.all()
    assert (allowed_transitions(LABELS, "IOB2").transitions == allowed.transitions).all()
    with pytest.raises(ValueError, match="BIO"):
        allowed_transitions(["O", "PER"])
    with pytest.raises(ValueError, match="BIO, IOB2"):
        allowed_transitions(LABELS, "BIOES")


def violates(path, allowed):
    return not (allowed.start[path[0]] and allowed.end[path[-1]]
                and all(allowed.transitions[a, b] for a, b in zip(path, path[1:])))


def test_constrained_decode_and_likelihood():
    allowed = allowed_transitions(LABELS)
    emissions, _, mask, params = random_case([6, 1, 3, 5, 6, 4, 2, 6], num_tags=5, seed=4)
    emissions[..., [2, 4]] += 2.0  # I- tags likely, so that unconstrained Viterbi breaks the scheme
    free, _ = crf_decode(emissions, mask, *params)
    assert any(violates(tuple(row[on]), allowed) for row, on in zip(np.asarray(free), mask))
    constrained = apply_constraints(*params, allowed)
    tags, _ = crf_decode(emissions, mask, *constrained)
    assert not any(violates(tuple(row[on]), allowed) for row, on in zip(np.asarray(tags), mask))

    steps = 3
    paths, scores = all_paths(emissions[0], steps, params, lambda p: not violates(p, allowed))
    bad = (2, 1, 4)
    candidates = np.array(paths[:: len(paths) // 7] + [bad])
    many = np.repeat(emissions[:1, :steps], len(candidates), axis=0)
    likelihoods = np.asarray(crf_log_likelihood(many, candidates, np.ones(candidates.shape, bool), *constrained))
    assert likelihoods[-1] < DISALLOWED / 2
    expected = [path_score(emissions[0], tuple(p), *params) - log_sum_exp(scores) for p in candidates[:-1]]
    np.testing.assert_allclose(likelihoods[:-1], expected, rtol=1e-5)


def test_module_parameters_and_methods():
    emissions, tags, mask, _ = random_case([5, 2, 1], num_tags=5, seed=5)
    model = CRF(5, labels=LABELS)
    variables = jax.jit(lambda key: model.init(key, emissions, tags, mask, method=CRF.log_likelihood))(
        jax.random.key(0))
    assert nn.get_partition_spec(variables)["params"] == {
        "transitions": P(None, "classes"), "start": P("classes"), "end": P("classes")}  # one name once per array
    params = nn.unbox(variables)["params"]
    assert all(p.dtype == jnp.float32 and np.abs(p).max() <= 0.1 for p in params.values())
    scores = apply_constraints(params["transitions"], params["start"], params["end"], allowed_transitions(LABELS))
    np.testing.assert_allclose(model.apply(variables, emissions, tags, mask, method=CRF.log_likelihood),
                               crf_log_likelihood(emissions, tags, mask, *scores), rtol=1e-6)
    tags_out, best = model.apply(variables, emissions, mask, method=CRF.decode)
    ref_tags, ref_best = crf_decode(emissions, mask, *scores)
    assert (tags_out == ref_tags).all() and np.allclose(best, ref_best)
    with pytest.raises(ValueError, match="first timestep"):
        crf_decode(emissions, np.roll(mask, 1, axis=1), *scores)
