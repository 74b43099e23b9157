"""Orbax checkpoints of a run: train state, data position and resolved config, async, kept K."""
from __future__ import annotations

import pathlib

import jax
import orbax.checkpoint as ocp

ITEMS = ("state", "data", "config")


def manager(directory: str | pathlib.Path, keep: int, async_save: bool = True) -> ocp.CheckpointManager:
    """The run's manager; the caller decides when to save, so every `save` is forced."""
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    return ocp.CheckpointManager(pathlib.Path(directory).absolute(), item_names=ITEMS, options=options)


def save(mngr: ocp.CheckpointManager, step: int, state, data_position: dict, config: dict) -> bool:
    return mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position),
        config=ocp.args.JsonSave(config)), force=True)


def restore(mngr: ocp.CheckpointManager, abstract_state, step: int | None = None):
    """(state, data position, config) restored onto the shardings carried by `abstract_state`."""
    step = mngr.latest_step() if step is None else step
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
        config=ocp.args.JsonRestore()))
    return restored["state"], restored["data"], restored["config"]


def restore_params(directory: str | pathlib.Path, abstract_params, step: int | None = None):
    """Only the parameters of another run's checkpoint (`train.init_from`), onto this run's shardings."""
    path = pathlib.Path(directory) / "checkpoints"
    path = path if path.is_dir() else pathlib.Path(directory)
    mngr = ocp.CheckpointManager(path.absolute(), item_names=ITEMS,
                                 options=ocp.CheckpointManagerOptions(read_only=True))
    step = mngr.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"train.init_from={directory}: no checkpoint found there")
    stored = ocp.PyTreeCheckpointer().metadata(path.absolute() / str(step) / "state").item_metadata.tree
    check_fits(stored.get("params", {}), abstract_params, f"train.init_from={directory}")
    target = {"params": abstract_params}
    restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
    mngr.close()
    return restored["state"]["params"]


def check_fits(stored, abstract, where: str, listed: int = 6) -> None:
    """Raise ValueError naming each parameter the checkpoint lacks or holds with another shape."""
    have = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_flatten_with_path(stored)[0]}
    problems = []
    for key, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        name = jax.tree_util.keystr(key)
        if name not in have:
            problems.append(f"{name} missing")
        elif have[name] != tuple(leaf.shape):
            problems.append(f"{name} checkpoint {have[name]} vs config {tuple(leaf.shape)}")
    if problems:
        more = f" (and {len(problems) - listed} more)" if len(problems) > listed else ""
        raise ValueError(f"{where}: the checkpoint does not fit model config: {'; '.join(problems[:listed])}{more}; "
                         "make the model section match the checkpoint (same preset and sizes)")
