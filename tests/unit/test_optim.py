"""Optimiser: decay mask, schedule, LAMB, Adafactor's sharded state and weight decay, gradient accumulation equal
to one big batch, and loss spikes rejected."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxlm import config as config_lib
from jaxlm.config import OptimConfig
import flax.linen as nn

from jaxlm.train.loop import build, compile_steps, global_batch
from jaxlm.train.optim import (all_finite, clip_by_global_norm, decay_mask, global_norm, reject_loss_spikes, schedule,
                               stacked_by_shape)
from jaxlm.train.state import create_state
from jaxlm.train import optim
from jaxlm.train.step import dropout_key, make_gradients

SMALL = {"model": {"preset": "bert-tiny", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                   "intermediate_size": 64, "vocab_size": 2000, "dtype": "float32",
                   "hidden_dropout": 0.0, "attention_dropout": 0.0},
         "data": {"max_seq_length": 32, "max_predictions": 5},
         "mesh": {"data": 2, "fsdp": 2, "tensor": 2, "rules": "fsdp_tp"},
         "train": {"global_batch": 16, "steps": 10}, "optim": {"warmup_steps": 2, "peak_lr": 1e-2}}


def _config(**sections):
    tree = {k: dict(v) for k, v in SMALL.items()}
    for name, values in sections.items():
        tree[name] = {**tree.get(name, {}), **values}
    return config_lib.from_dict(tree)


def _run(config, steps):
    setup = build(config)
    state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                         jax.random.key(0))
    train_step, _ = compile_steps(setup)
    batch = global_batch(setup, setup.objective.synthetic_batch(config.train.global_batch))
    losses = []
    for _ in range(steps):
        state, metrics = train_step(state, batch, dropout_key(config.train))
        losses.append(float(metrics["loss"]))
    return state, losses


def test_decay_mask_skips_norms_and_biases():
    params = {"layer": {"kernel": 1.0, "bias": 1.0, "norm": {"scale": 1.0, "bias": 1.0}}, "embedding": 1.0}
    assert decay_mask(params) == {"layer": {"kernel": True, "bias": False, "norm": {"scale": False, "bias": False}},
                                  "embedding": True}


def test_schedule_warms_up_then_decays_linearly():
    lr = schedule(OptimConfig(peak_lr=1.0, warmup_steps=10, end_lr=0.0), 110)
    assert float(lr(0)) == 0.0
    assert np.isclose(float(lr(5)), 0.5)
    assert np.isclose(float(lr(10)), 1.0)
    assert np.isclose(float(lr(60)), 0.5)
    assert np.isclose(float(lr(110)), 0.0)


def test_gradient_accumulation_matches_the_full_batch():
    one, one_losses = _run(_config(), 3)
    four, four_losses = _run(_config(optim={"grad_accum": 4}), 3)
    np.testing.assert_allclose(one_losses, four_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=5e-5)


def _uneven_batch(objective, size: int, grad_accum: int) -> dict:
    """Micro-batch 0 (rows 0, k, 2k, ... as the step splits them) holds one weighted prediction in
    all; every other row holds five."""
    batch = objective.synthetic_batch(size)
    weights = np.zeros_like(batch["masked_weights"])
    weights[:, :5] = 1.0
    weights[::grad_accum] = 0.0
    weights[0, 0] = 1.0
    batch["masked_weights"] = weights
    return batch


def test_accumulated_gradient_equals_the_full_batch_gradient_with_uneven_weights():
    setup = build(_config())
    params = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                          jax.random.key(0)).params
    batch = global_batch(setup, _uneven_batch(setup.objective, 16, 4))
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        whole_batch = jax.jit(make_gradients(setup.objective, 1))  # one jitted function, reused below
        full, full_stats = whole_batch(params, batch, jax.random.key(1))
        accumulated, stats = jax.jit(make_gradients(setup.objective, 4))(params, batch, jax.random.key(1))
    for name in full_stats:
        np.testing.assert_allclose(float(stats[name]), float(full_stats[name]), rtol=1e-5)
    np.testing.assert_allclose(float(optax.tree.norm(accumulated)), float(optax.tree.norm(full)), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(accumulated), jax.tree.leaves(full)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
    # averaging each micro-batch's mean loss (the old rule) gives another gradient on this batch
    means = [whole_batch(params, jax.tree.map(lambda x: x[i::4], batch), jax.random.key(1))[0] for i in range(4)]
    averaged = jax.tree.map(lambda *g: sum(g) / 4, *means)
    assert abs(float(optax.tree.norm(averaged)) / float(optax.tree.norm(full)) - 1) > 0.05


def _collectives(hlo: str) -> dict[str, int]:
    return {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in
            ("all-gather", "collective-permute", "all-to-all", "all-reduce", "reduce-scatter")}


def test_accumulation_adds_no_collectives_under_dp():
    counts = {}
    for accum in (1, 4):
        config = _config(mesh={"data": 8, "fsdp": 1, "tensor": 1, "rules": "dp"},
                         train={"global_batch": 64}, optim={"grad_accum": accum})
        compiled, _ = compile_steps(build(config), with_eval=False)
        counts[accum] = _collectives(compiled.as_text())
    for op in ("all-gather", "collective-permute", "all-to-all"):
        assert counts[4][op] == 0, counts
    assert counts[1]["all-gather"] == 0 and counts[1]["collective-permute"] == 0, counts
    assert counts[4]["all-reduce"] >= 1, counts


def test_adamw_and_lamb_fit_a_batch():
    for name, peak_lr in (("adamw", 1e-2), ("lamb", 5e-2)):
        _, losses = _run(_config(optim={"name": name, "peak_lr": peak_lr}), 10)
        assert losses[-1] < losses[0] - 0.5, (name, losses)


def test_adafactor_replicates_a_matrix_s_factored_moments_keeps_the_rest_sharded_and_fits_a_batch():
    """T5's optimiser on 8 devices (fsdp x tensor): a matrix's second moments, a row and a column the sizes of
    its sides, replicated; those of the parameters it does not factor laid out as the parameter is."""
    state, losses = _run(_config(model={"hidden_size": 128, "intermediate_size": 256},
                                 optim={"name": "adafactor", "b1": 0.0}), 10)
    assert losses[-1] < losses[0] - 0.4, losses
    params = state.params
    v_row, v_col, v = (optax.tree.get(state.opt_state, name) for name in ("v_row", "v_col", "v"))
    embedding = params["encoder"]["embeddings"]["word"]["embedding"]
    assert v_row["encoder"]["embeddings"]["word"]["embedding"].shape == embedding.shape[1:]
    assert v_col["encoder"]["embeddings"]["word"]["embedding"].shape == embedding.shape[:1]
    for moments in (v_row, v_col, v):
        for moment, param in zip(jax.tree.leaves(moments), jax.tree.leaves(params)):
            want = param.sharding.spec if moment.shape == param.shape else P()
            assert moment.sharding.spec == want, (moment.shape, param.shape, moment.sharding.spec)
    key = params["encoder"]["layer_0"]["attention"]["key"]["kernel"]  # per head, sides under 128: unfactored
    assert v["encoder"]["layer_0"]["attention"]["key"]["kernel"].sharding.spec == key.sharding.spec != P()


def test_adafactor_decays_weights_by_the_learning_rate_times_the_rate_and_spares_biases():
    """AdamW's weight decay (optax's Adafactor takes its rate unscaled by the learning rate): with no gradient, a
    kernel shrinks by lr x weight_decay of itself; a bias, masked, stays."""
    adafactor = optim.adafactor(OptimConfig(name="adafactor", weight_decay=0.1, b1=0.0), lambda step: 0.5)
    params = {"kernel": jnp.full((256, 128), 2.0), "bias": jnp.full((128,), 2.0)}
    updates, _ = adafactor.update(jax.tree.map(jnp.zeros_like, params), adafactor.init(params), params)
    np.testing.assert_allclose(updates["kernel"], -0.5 * 0.1 * 2.0, rtol=1e-6)
    np.testing.assert_array_equal(updates["bias"], 0.0)


def test_clipping_bounds_the_update():
    config = _config(optim={"clip_norm": 1e-3})
    clipped = clip_by_global_norm(1e-3)
    grads = {"w": np.full((4,), 10.0, np.float32)}
    updates, _ = clipped.update(grads, clipped.init(grads))
    assert np.isclose(float(optax.tree.norm(updates)), 1e-3, rtol=1e-4)
    assert config.optim.clip_norm == 1e-3


@pytest.mark.parametrize("platform", ["gpu", "cpu"])
def test_norm_clipping_and_finiteness_reduce_same_shaped_leaves_stacked(platform, monkeypatch):
    """Built for GPUs, global_norm reduces each group of same-shaped leaves stacked (one kernel a group, not one
    a leaf), elsewhere each leaf: both give optax.tree.norm's value in float32 (optax squares a bfloat16 leaf in
    bfloat16); our clipping gives optax's updates; all_finite finds a NaN or an infinity in any leaf of a group
    and in a leaf alone."""
    monkeypatch.setattr(optim, "target_platform", lambda: platform)
    rng = np.random.default_rng(0)
    tree = {"layers": [{"w": rng.normal(size=(8, 4)).astype(np.float32) * 10,
                        "b": rng.normal(size=(4,)).astype(np.float32)} for _ in range(3)],
            "scale": np.ones(4, np.float32), "embed": jnp.asarray(rng.normal(size=(16, 8)), jnp.bfloat16)}
    groups = [(3, 8, 4), (4, 4), (16, 8)] if platform == "gpu" else [(4,)] * 4 + [(8, 4)] * 3 + [(16, 8)]
    assert sorted(g.shape for g in stacked_by_shape(tree)) == groups
    in_float32 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)
    np.testing.assert_allclose(float(global_norm(tree)), float(optax.tree.norm(in_float32)), rtol=1e-6)
    for max_norm in (1.0, 1e6):  # clipped, and left as it is
        ours, _ = clip_by_global_norm(max_norm).update(tree, optax.EmptyState())
        assert [a.dtype for a in jax.tree.leaves(ours)] == [a.dtype for a in jax.tree.leaves(tree)]
        theirs, _ = optax.clip_by_global_norm(max_norm).update(in_float32, optax.EmptyState())
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            resolution = 1e-5 if a.dtype == np.float32 else 8e-3
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=resolution)
    assert bool(all_finite(tree))
    nan_in_a_group = jax.tree.map(np.copy, tree)
    nan_in_a_group["layers"][1]["w"][2, 3] = np.nan
    alone = dict(tree, embed=tree["embed"].at[5, 1].set(jnp.inf))
    assert not bool(all_finite(nan_in_a_group)) and not bool(all_finite(alone))
    assert not np.isfinite(float(global_norm(nan_in_a_group)))


def test_same_shaped_leaves_of_different_layouts_are_stacked_apart_under_explicit_axes(monkeypatch):
    """Under explicit axes a layout is part of an array's type, and arrays of two layouts cannot stack."""
    monkeypatch.setattr(optim, "target_platform", lambda: "gpu")
    mesh = jax.make_mesh((2, 4), ("rows", "cols"))
    rng = np.random.default_rng(1)
    tree = [rng.normal(size=(8, 8)).astype(np.float32) for _ in range(3)]
    with jax.set_mesh(mesh):
        assert mesh.are_all_axes_explicit
        layouts = [P("rows", None), P("rows", None), P(None, "cols")]
        placed = [jax.device_put(x, layout) for x, layout in zip(tree, layouts)]
        assert sorted(g.shape for g in stacked_by_shape(placed)) == [(2, 8, 8), (8, 8)]
        norm = jax.jit(global_norm)(placed)
    np.testing.assert_allclose(float(norm), float(optax.tree.norm(tree)), rtol=1e-6)


def test_the_step_reports_parameters_an_update_made_non_finite(monkeypatch):
    """A finite loss and finite gradients, but an update that overflows: the step's non-finite flag is set
    (train.nonfinite=stop stops there, before a checkpoint could save the parameters). Built for a GPU the step
    tests the new parameters, elsewhere the updates: both here."""
    config = _config()
    overflowing = build(config, optimizer_for=lambda params: (optax.scale(np.float32(np.inf)), lambda step: 0.0))
    state = create_state(overflowing.objective.init, overflowing.optimizer, overflowing.shardings, overflowing.mesh,
                         overflowing.rules, jax.random.key(0))
    batch = global_batch(overflowing, overflowing.objective.synthetic_batch(config.train.global_batch))
    for platform in ("gpu", "cpu"):
        monkeypatch.setattr(optim, "target_platform", lambda: platform)
        train_step, _ = compile_steps(overflowing, with_eval=False)
        _, metrics = train_step(jax.tree.map(jnp.copy, state), batch, dropout_key(config.train))
        assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
        assert int(metrics["nonfinite_in_a_row"]) == 1, platform


def test_a_loss_spike_is_rejected_as_a_non_finite_step_and_kept_out_of_the_window():
    """reject_loss_spikes before optax.apply_if_finite(sgd): losses 1.0 ± 0.1 fill the window of 4; a loss
    of 5 is a spike (its update dropped, counted, kept out of the window), then 1.05 is accepted again."""
    optimizer = optax.chain(reject_loss_spikes(3.0, 4), optax.apply_if_finite(optax.sgd(0.1), 10))
    params = {"w": jnp.ones(3)}
    state = optimizer.init(params)
    grads = {"w": jnp.full(3, 2.0)}
    for loss in (1.0, 1.1, 0.9, 1.0, 5.0, 1.05):
        updates, state = optimizer.update(grads, state, params, loss=jnp.float32(loss))
        spike_state, finite_state = state[0], state[1]
        if loss == 5.0:
            assert bool(spike_state.last_step_spiked) and int(finite_state.notfinite_count) == 1
            np.testing.assert_array_equal(updates["w"], 0.0)
        else:
            assert not bool(spike_state.last_step_spiked) and int(finite_state.notfinite_count) == 0
            np.testing.assert_allclose(updates["w"], -0.2)
    assert int(spike_state.loss_spikes) == 1 and int(spike_state.losses_seen) == 5
    np.testing.assert_allclose(spike_state.recent_losses, [1.05, 1.1, 0.9, 1.0])  # a ring: 1.05 replaced the first


def test_the_train_step_drops_a_spiking_update_and_reports_it():
    """The real compiled step with train.spike_sigmas: a window of zeros makes any loss a spike."""
    config = _config(train={"nonfinite": "skip", "spike_sigmas": 3.0, "spike_window": 4})
    setup = build(config)
    state = create_state(setup.objective.init, setup.optimizer, setup.shardings, setup.mesh, setup.rules,
                         jax.random.key(0))
    train_step, _ = compile_steps(setup)
    batch = global_batch(setup, setup.objective.synthetic_batch(config.train.global_batch))
    state, metrics = train_step(state, batch, dropout_key(config.train))
    assert int(metrics["loss_spikes"]) == 0 and int(metrics["skipped_steps"]) == 0
    spike_state = state.opt_state[0]
    primed = spike_state._replace(recent_losses=jnp.zeros_like(spike_state.recent_losses),
                                  losses_seen=jnp.full_like(spike_state.losses_seen, 4))
    before = state.replace(opt_state=(primed, *state.opt_state[1:]))
    params_before = jax.device_get(before.params)  # the step donates its input state
    after, metrics = train_step(before, batch, dropout_key(config.train))
    assert bool(metrics["last_step_spiked"]) and int(metrics["loss_spikes"]) == 1
    assert int(metrics["nonfinite_in_a_row"]) == 1 and int(metrics["skipped_steps"]) == 1
    for old, new in zip(jax.tree.leaves(params_before), jax.tree.leaves(after.params)):
        np.testing.assert_array_equal(np.asarray(old), np.asarray(new))
