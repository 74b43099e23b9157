"""Orbax checkpoints of a run: train state, data position and resolved config, async, kept K; a failed write
reported once, in one line; resuming from the newest one that restores, past saves cut off or files broken;
and the one resolver from any checkpoint path to (manager, step)."""
from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from typing import Callable, Iterator

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from jaxlm.errors import first_line
from jaxlm.train.faults import TrainingStopped
from jaxlm.train.storage import run_path

ITEMS = ("state", "data", "config")


def manager(directory: epath.PathLike, keep: int, async_save: bool = True) -> ocp.CheckpointManager:
    """The run's manager; the caller decides when to save, so every `save` is forced."""
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    return ocp.CheckpointManager(run_path(directory), item_names=ITEMS, options=options)


def best_manager(directory: epath.PathLike, metric: str) -> ocp.CheckpointManager:
    """A manager that keeps only the checkpoint with the highest `metric` (Orbax's best_fn policy)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=1, best_fn=lambda metrics: metrics[metric], best_mode="max",
                                           keep_checkpoints_without_metrics=False, create=True)
    return ocp.CheckpointManager(run_path(directory), item_names=ITEMS, options=options)


def save(mngr: ocp.CheckpointManager, step: int, state, data_position: dict, config: dict,
         metrics: dict | None = None) -> bool:
    return mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position),
        config=ocp.args.JsonSave(config)), metrics=metrics, force=True)


@contextlib.contextmanager
def stop_if_writing_fails(mngr: ocp.CheckpointManager, step: int, then: str) -> Iterator[None]:
    """A save or a wait for saves in the block that fails (a full disk, permission denied) stops the run in one
    line: what the file system said, the checkpoints kept, and `then`, what to do."""
    try:
        yield
    except Exception as err:  # Orbax passes on whatever the file system raised
        reason = first_line(err)
        if len(reason) > 200:  # Orbax's messages name every layer; the last says what the file system said
            reason = reason.rsplit(": ", 1)[-1]
        kept = ", ".join(map(str, mngr.all_steps())) or "none"
        raise TrainingStopped(f"writing checkpoints to {mngr.directory} failed by step {step} ({reason}); the "
                              f"committed ones are kept (steps: {kept}). Free space or fix the permissions, "
                              f"then {then}") from None


def restore(mngr: ocp.CheckpointManager, abstract_state, step: int | None = None):
    """(state, data position, config) restored onto the shardings carried by `abstract_state`."""
    step = mngr.latest_step() if step is None else step
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
        config=ocp.args.JsonRestore()))
    return restored["state"], restored["data"], restored["config"]


def stored_config(mngr: ocp.CheckpointManager, step: int) -> dict | None:
    """A step's config item (the settings of the run that wrote it); None when it records no model config."""
    stored = mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))["config"]
    return stored if isinstance(stored, dict) and isinstance(stored.get("model"), dict) else None


def finetuned_task(mngr: ocp.CheckpointManager, step: int) -> str:
    """The finetune.task a step's run was fine-tuned for; empty for pretraining runs and conversions."""
    return str(((stored_config(mngr, step) or {}).get("finetune") or {}).get("task") or "")


def unfinished(directory: epath.PathLike) -> list[epath.Path]:
    """Saves that never committed (Orbax's temporary directories, or a cloud save without its commit
    marker): what a run stopped while writing leaves behind."""
    directory = run_path(directory)
    return sorted(directory.glob(f"*{ocp.path.step.TMP_DIR_SUFFIX}*")) if directory.is_dir() else []


def restore_newest(mngr: ocp.CheckpointManager, abstract_state, warn: Callable[[str], None]):
    """(state, data position, step) of the newest checkpoint that restores, None when the run has none; a
    ValueError when none restores but some were set aside as unreadable (now or by an earlier start).

    Uncommitted saves are named and not restored (Orbax never lists them); Orbax writes over its own
    `N.orbax-checkpoint-tmp` when it saves step N again. A committed checkpoint that cannot be read
    (truncated or missing files) is moved to `unreadable-checkpoints/` beside the checkpoints, never deleted,
    and the one before it is tried. One whose shapes or optimiser state differ from this config's is not broken:
    that stops the run, saying so."""
    suffix = ocp.path.step.TMP_DIR_SUFFIX
    for path in unfinished(mngr.directory):
        own_name = path.name.endswith(suffix)  # older Orbax versions added a timestamp, which no save reuses
        replaced = ", and a new save of that step replaces it" if own_name else ""
        warn(f"{path} is a checkpoint save that never committed (the run stopped while writing it); "
             f"it is not restored{replaced}")
    for step in sorted(mngr.all_steps(), reverse=True):
        try:
            stored = stored_tree(mngr, step)
        except Exception as err:  # Orbax and TensorStore raise many kinds for a broken directory
            _set_aside(mngr, step, err, warn)
            continue
        where = f"resuming from {mngr.directory / str(step)}"
        check_state_fits(stored, abstract_state, where)
        try:
            state, position, _ = restore(mngr, abstract_state, step)
        except Exception as err:  # likewise
            if isinstance(err, ValueError) and "tree structures do not match" in str(err):  # Orbax's words: not damage
                raise ValueError(f"{where}: the checkpoint's train state is laid out otherwise than this config's: "
                                 f"{STATE_DIFFERS}") from None
            _set_aside(mngr, step, err, warn)
            continue
        return state, position, step
    aside = unreadable_dir(mngr)
    set_aside = sorted((p.name for p in aside.iterdir()), key=_step_order) if aside.is_dir() else []
    if set_aside:  # from step 0, their steps would be trained (and logged) again
        raise ValueError(f"no checkpoint of {mngr.directory} restores (set aside in {aside}: {', '.join(set_aside)}); "
                         f"put a repaired one back in {mngr.directory}, or remove the run directory (or choose "
                         "another train.run_dir) to start afresh")
    return None


def unreadable_dir(mngr: ocp.CheckpointManager) -> epath.Path:
    """Where the run's unreadable checkpoints are set aside."""
    return mngr.directory.parent / "unreadable-checkpoints"


def _step_order(name: str) -> tuple[int, str]:
    step, _, copy = name.partition("-")
    return (-int(step) if step.isdigit() else 0, copy)


def _set_aside(mngr: ocp.CheckpointManager, step: int, err: Exception, warn) -> None:
    source = mngr.directory / str(step)
    aside = unreadable_dir(mngr)
    target = next(aside / name for name in (str(step), *(f"{step}-{n}" for n in range(2, 10**6)))
                  if not (aside / name).exists())
    if jax.process_index() == 0:
        target.parent.mkdir(exist_ok=True)
        source.rename(target)
    multihost_utils.sync_global_devices(f"jaxlm: checkpoint {step} set aside")
    mngr.reload()
    reason = first_line(err)[:300]
    warn(f"checkpoint {step} cannot be restored ({reason}); moved to {target}; trying an older one")


def resolve(path: epath.PathLike) -> tuple[epath.Path, int | None]:
    """(the Orbax manager directory, the step the path names or None) of a run directory, its
    `checkpoints/` directory, one `checkpoints/<step>` directory or a converted checkpoint."""
    path = run_path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; a checkpoint is a directory: a run's train.run_dir, one of its "
                                 "checkpoints/<step>, or the output of `jaxlm convert`")
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {path}")
    if path.name.isdigit() and (path / "state").is_dir():
        return path.parent, int(path.name)
    if is_run_dir(path):
        return path / "checkpoints", None
    return path, None


def is_run_dir(path) -> bool:
    """Whether `path` is a training or fine-tuning run's directory: it holds checkpoints/."""
    return (run_path(path) / "checkpoints").is_dir()


def has_checkpoint(run_dir: epath.PathLike) -> bool:
    """Whether a run's directory holds a committed checkpoint to resume from."""
    if not is_run_dir(run_dir):
        return False
    with open_checkpoint(run_dir) as (_, step):
        return step is not None


def read_only_manager(directory: epath.PathLike) -> ocp.CheckpointManager:
    """A manager that reads `directory`'s checkpoints and writes nothing."""
    # the settings read_only implies, given, so that Orbax does not warn that it set them
    options = ocp.CheckpointManagerOptions(read_only=True, save_interval_steps=0, create=False)
    return ocp.CheckpointManager(directory, item_names=ITEMS, options=options)


@contextlib.contextmanager
def open_checkpoint(path: epath.PathLike, step: int | None = None
                    ) -> Iterator[tuple[ocp.CheckpointManager, int | None]]:
    """(read-only manager, step) of any path `resolve` takes: `step`, else the path's own step, else
    the latest committed one (None when there is none)."""
    directory, own = resolve(path)
    mngr = read_only_manager(directory)
    try:
        yield mngr, step if step is not None else own if own is not None else mngr.latest_step()
    finally:
        mngr.close()


# how Orbax's logs of a step metadata file it could not read or parse begin (their first argument: the file)
UNREADABLE_METADATA = ("Failed to read Metadata file:", "Failed to json parse Metadata file:")
_unreadable_metadata_said: set[str] = set()


def quiet_failed_writes() -> None:
    """A failed save is reported once, by the caller. Orbax logs it again from each of its threads with
    the traceback: keep the first line of those records. TensorStore's callbacks then find the save's
    event loop closed and print that as unraisable, and asyncio logs the save's failed tasks and warns of
    its coroutines that never ran, as they are collected (jaxlm has no asyncio of its own): drop those."""
    logging.getLogger("absl").addFilter(_orbax_error_in_one_line)
    logging.getLogger("asyncio").addFilter(_no_unretrieved_task)
    warnings.filterwarnings("ignore", message="coroutine '.*' was never awaited", category=RuntimeWarning)
    if sys.unraisablehook is not _skip_closed_loop:
        _skip_closed_loop.passes_on_to = sys.unraisablehook
        sys.unraisablehook = _skip_closed_loop


def _orbax_error_in_one_line(record: logging.LogRecord) -> bool:
    """Orbax's errors without their tracebacks; its notice that a manager opened read-only (as asked) dropped;
    a step's unreadable metadata file (times, which reading the step does not need) said once, as a warning."""
    message = record.getMessage()
    if message.startswith("Given directory is read only"):
        return False
    if str(record.msg).startswith(UNREADABLE_METADATA) and record.args:
        path = str(record.args[0])
        if path in _unreadable_metadata_said:
            return False
        _unreadable_metadata_said.add(path)
        record.levelno, record.levelname, record.args = logging.WARNING, "WARNING", ()
        record.msg = (f"{path} cannot be read as JSON; it holds the step's times, which reading the checkpoint "
                      "does not need")
        return True
    if record.levelno >= logging.ERROR and record.exc_info and "/orbax/" in record.pathname:
        record.msg, record.args = (record.getMessage().strip().splitlines() or [""])[0], ()
        record.exc_info = record.exc_text = None
    return True


def _no_unretrieved_task(record: logging.LogRecord) -> bool:
    """False for asyncio's 'Task exception was never retrieved' and its kin (Future, _GatheringFuture)."""
    return not record.getMessage().split("\n", 1)[0].endswith("exception was never retrieved")


def _skip_closed_loop(unraisable) -> None:
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
        _skip_closed_loop.passes_on_to(unraisable)


def stored_tree(mngr: ocp.CheckpointManager, step: int):
    """The tree metadata (shapes, dtypes) of a step's state, without reading its arrays. Read through the
    handler: a Checkpointer would look for step metadata inside the item and warn that there is none."""
    return ocp.PyTreeCheckpointHandler().metadata(mngr.directory / str(step) / "state").tree


def restore_params(path: epath.PathLike, abstract_params, step: int | None = None, setting: str = "train.init_from"):
    """Only the parameters of another checkpoint, onto this run's shardings; errors name it as `setting`=path (an
    empty `setting`: the path alone, as a command given it says it)."""
    with _params_source(path, abstract_params, step, setting) as (mngr, step):
        target = {"params": abstract_params}
        restored = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
    return restored["state"]["params"]


def check_params_source(path: epath.PathLike, abstract_params, setting: str = "train.init_from") -> None:
    """What `restore_params` would refuse, refused without reading any array: before a run makes its directory."""
    with _params_source(path, abstract_params, None, setting):
        pass


@contextlib.contextmanager
def _params_source(path: epath.PathLike, abstract_params, step: int | None, setting: str
                   ) -> Iterator[tuple[ocp.CheckpointManager, int]]:
    """(read-only manager, step) of a checkpoint whose parameters fit `abstract_params`; a ValueError or
    FileNotFoundError naming it as `setting`=path where none is there, it cannot be read or it does not fit."""
    named = f"{setting}={path}" if setting else str(path)
    if not run_path(path).is_dir():
        raise FileNotFoundError(f"{named}: no checkpoint found there")
    with open_checkpoint(path, step) as (mngr, step):
        if step is None:
            raise FileNotFoundError(f"{named}: no checkpoint found there")
        try:
            stored = stored_tree(mngr, step)
        except (OSError, ValueError) as err:  # Orbax's FileNotFoundError for a missing _METADATA, JSON's errors
            raise ValueError(f"{named}: checkpoint {step} cannot be read ({first_line(err)}); name a run "
                             "directory or checkpoint whose save completed") from None
        try:
            check_fits(stored.get("params", {}), abstract_params, named)
        except ValueError:
            task = finetuned_task(mngr, step)
            if not task:
                raise
            raise ValueError(f"{named} is fine-tuned for {task}: its head is not this model's, and it keeps none of "
                             "the pretraining heads; start from the checkpoint it was fine-tuned from (its "
                             "finetune.init_from)") from None
        yield mngr, step


def params_left_out(path: epath.PathLike, abstract_params, step: int | None = None) -> list[str]:
    """The parameters of another checkpoint (`train.init_from`) that `restore_params` leaves out, since this
    run's model has none of that name: layers or heads that a shallower model or another objective lacks."""
    with open_checkpoint(path, step) as (mngr, step):
        stored = stored_tree(mngr, step).get("params", {})
    wanted = leaf_shapes(abstract_params)
    return [name for name in leaf_shapes(stored) if name not in wanted]


# why a run's own checkpoint does not restore into this config's train state, and what to do
STATE_DIFFERS = ("the optimiser settings (optim.*, train.nonfinite) or the jaxlm version differ from the run's; "
                 "resume with the run's own config (its config.json)")


def check_state_fits(stored, abstract_state, where: str) -> None:
    """The parameters fit (check_fits), and the optimiser state holds the same arrays."""
    check_fits(stored.get("params", {}), abstract_state.params, where)
    have = sorted(tuple(leaf.shape) for leaf in jax.tree.leaves(stored))
    want = sorted(tuple(leaf.shape) for leaf in jax.tree.leaves(abstract_state))
    if have != want:
        raise ValueError(f"{where}: the checkpoint's train state holds {len(have)} arrays where this config's "
                         f"holds {len(want)}: {STATE_DIFFERS}")


def leaf_shapes(tree) -> dict[str, tuple]:
    """{"['encoder']['kernel']": shape} of every leaf of a parameter tree, in its flattening order."""
    return {jax.tree_util.keystr(k): tuple(v.shape) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_fits(stored, abstract, where: str, listed: int = 6) -> None:
    """Raise ValueError naming each parameter the checkpoint lacks or holds with another shape."""
    have = leaf_shapes(stored)
    if have and not set(have) & set(leaf_shapes(abstract)):
        raise ValueError(f"{where}: the checkpoint holds another model ({', '.join(sorted(stored))}; this config: "
                         f"{', '.join(sorted(abstract))}), none of whose parameters this config has: a run of another "
                         "model family or objective? Give a checkpoint of this model, or the config it was trained "
                         "with")
    problems = []
    for name, shape in leaf_shapes(abstract).items():
        if name not in have:
            problems.append(f"{name} missing")
        elif have[name] != shape:
            problems.append(f"{name} checkpoint {have[name]} vs config {shape}")
    layouts = layer_layout(have), layer_layout(leaf_shapes(abstract))
    if problems and None not in layouts and layouts[0] != layouts[1]:
        raise ValueError(f"{where}: the checkpoint stores its layers {LAYOUT_WORDS[layouts[0]]} and this config "
                         f"{LAYOUT_WORDS[layouts[1]]}: set model.scan_layers={str(layouts[0] == 'scan').lower()}")
    if problems:
        more = f" (and {len(problems) - listed} more)" if len(problems) > listed else ""
        raise ValueError(f"{where}: the checkpoint does not fit model config: {'; '.join(problems[:listed])}{more}; "
                         "make the model section match the checkpoint (same preset and sizes)")


LAYOUT_WORDS = {"scan": "stacked (model.scan_layers=true)", "loop": "one by one (model.scan_layers=false)"}


def layer_layout(names) -> str | None:
    """"scan" where parameter names (leaf_shapes' keys) hold one stacked `layers` subtree, "loop" where they hold
    `layer_0`.. (jaxlm.convert.layout), None where neither."""
    if any("['layers']" in name for name in names):
        return "scan"
    return "loop" if any(re.search(r"\['layer_\d+'\]", name) for name in names) else None
