"""The training Runner: resume under ``torch.load(weights_only=True)``, checkpoints that carry
their config as data, clear errors for a checkpoint or data loader that cannot work."""
import glob
import inspect
import math
import os

from mmengine.dist import master_only
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper
from mmengine.runner import Runner
from mmengine.runner.checkpoint import _load_checkpoint_to_model

from ifnd.engine.run_paths import check_run_paths, write_config_dump
from ifnd.engine.work_dir import check_work_dir, resume_checkpoint, run_folders
from ifnd.fileio import TEMP_PREFIX, check_state_fits, config_to_data, read_checkpoint
from ifnd.registry import RUNNERS


@RUNNERS.register_module()
class SafeLoadRunner(Runner):
    """mmengine's Runner whose checkpoint loads (resume included) allow mmengine's own state.

    torch >= 2.6 loads with ``weights_only=True`` and refuses mmengine's resume state; rather
    than loading untrusted files with ``weights_only=False``, the few plain-data classes it needs
    are allowed, only while loading.

    ``--resume`` without a path continues from the work dir's own files (:func:`resume_checkpoint`),
    and the optimizer settings named in ``resume_optimizer_keys`` (tools/train.py: those given
    with ``--cfg-options optim_wrapper.optimizer.KEY=...``) are taken from this run's config
    instead of the checkpoint.

    Every path the run writes (:func:`check_run_paths`: the work dir, the config dump, the log folder
    and its files, hooks' folders) is checked before mmengine writes the first, and the config dump
    is written atomically, never over a file of its name that no run dumped.
    """

    resume_optimizer_keys: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs) -> None:
        # mmengine makes the work dir first thing; the log folder's name is known in setup_env.
        arguments = inspect.signature(Runner.__init__).bind(self, *args, **kwargs).arguments
        check_work_dir(arguments['work_dir'])
        super().__init__(*args, **kwargs)

    def setup_env(self, env_cfg: dict) -> None:
        """mmengine's set-up (processes, the start time naming the log folder), then every path the
        run writes checked before mmengine makes the log folder, the log and the visualizer's files."""
        super().setup_env(env_cfg)
        check_run_paths(self.cfg, self.work_dir, self.timestamp)

    @master_only
    def dump_config(self) -> None:
        """Write the config to the work dir atomically, never over a user's file of that name."""
        kept = write_config_dump(self.cfg, self.work_dir, self.timestamp)
        if kept:
            self.logger.warning(kept)

    def load_or_resume(self) -> None:
        """Load or resume as mmengine does, but refuse ``--resume`` when there is nothing to resume."""
        if self._resume and self._load_from is None and not self._has_loaded:
            path, note = resume_checkpoint(self.work_dir)
            if path is None:
                raise FileNotFoundError(
                    f'--resume found no checkpoint in {self.work_dir} (no last_checkpoint file, no '
                    'epoch_*.pth or iter_*.pth); start the run without --resume, or pass the file: '
                    '--resume PATH/epoch_N.pth')
            if note:
                self.logger.warning(note)
            self._load_from = path
        resuming = self._resume and not self._has_loaded
        if resuming:
            self._remove_unfinished_writes()
        wanted = self._optimizer_settings() if resuming and self.resume_optimizer_keys else None
        super().load_or_resume()
        if wanted:
            self._apply_optimizer_settings(wanted)
        elif resuming and self.resume_optimizer_keys:
            self.logger.warning(f'{", ".join(self.resume_optimizer_keys)} from the command line not '
                                f'applied to a {type(self.optim_wrapper).__name__} (one built '
                                "OptimWrapper only): the checkpoint's values hold")

    def _optimizer_settings(self) -> list[dict] | None:
        """This run's configured values of ``resume_optimizer_keys``, per param group, before resuming."""
        if not isinstance(self.optim_wrapper, OptimWrapper):
            return None  # not built (val/test) or several optimizers: nothing to carry over
        # A scheduler moves the current value; the configured one is kept as initial_<key>.
        return [{k: g.get(f'initial_{k}', g[k]) for k in self.resume_optimizer_keys if k in g}
                for g in self.optim_wrapper.optimizer.param_groups]

    def _apply_optimizer_settings(self, wanted: list[dict]) -> None:
        """Put this run's optimizer values in place of the resumed ones, at the schedule's position.

        The checkpoint restores every param group's values and the schedulers' ``base_values``;
        a numeric value is scaled by new/old configured value, which follows multiplicative
        schedules exactly (warm-up, steps, cosine to zero), and the schedulers' base values become
        the new ones, so the rest of the schedule is the new value's.
        """
        groups = self.optim_wrapper.optimizer.param_groups
        schedulers = self.param_schedulers or []
        if isinstance(schedulers, dict):
            schedulers = [s for group in schedulers.values() for s in group]
        changed = []
        for key in self.resume_optimizer_keys:
            before = None
            for group, values in zip(groups, wanted):
                if key not in values or key not in group:
                    continue
                new, old = values[key], group.get(f'initial_{key}', group[key])
                before = old if before is None else before
                numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                              for v in (new, old, group[key]))
                group[key] = group[key] * new / old if numbers and old else new
                if f'initial_{key}' in group:
                    group[f'initial_{key}'] = new
            for scheduler in schedulers:
                if getattr(scheduler, 'param_name', None) == key:
                    scheduler.base_values = [g.get(f'initial_{key}', g[key]) for g in groups]
                    scheduler._last_value = [g[key] for g in groups]
            if before is not None and wanted[0].get(key) != before:
                now = groups[0][key]
                new = wanted[0][key]
                same = now == new or all(isinstance(v, (int, float)) for v in (now, new)) \
                    and math.isclose(now, new)
                changed.append(f"{key}={new} from the command line instead of the checkpoint's "
                               f'{before}' + ('' if same else f' ({now:.6g} at this point of the '
                                                                'schedule)'))
        if changed:
            self.logger.info('Resumed with ' + '; '.join(changed))

    def call_hook(self, fn_name: str, **kwargs) -> None:
        """Call the hooks; a checkpoint about to be saved gets its config as plain data, not text."""
        if fn_name == 'before_save_checkpoint':
            meta = kwargs['checkpoint'].get('meta')
            if isinstance(meta, dict) and 'cfg' in meta:
                meta['cfg'] = config_to_data(self.cfg)
        super().call_hook(fn_name, **kwargs)

    def build_train_loop(self, loop):
        """mmengine's training loop, refusing a data loader that yields no batch at all."""
        loop = super().build_train_loop(loop)
        dataloader = getattr(loop, 'dataloader', None)
        if dataloader is not None and hasattr(dataloader, '__len__') and len(dataloader) == 0:
            raise ValueError(empty_loader_message(dataloader))
        return loop

    def _remove_unfinished_writes(self) -> None:
        # Checkpoints in the work dir, pseudo labels and summaries one folder down; plain files only.
        for path in sorted(path for folder in run_folders(self.work_dir)
                           for path in glob.glob(os.path.join(glob.escape(folder), TEMP_PREFIX + '*'))):
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                self.logger.info(f'Removed {path}, left by a run stopped while writing it')

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]):  # noqa: B006 (mmengine's API)
        """Load a checkpoint into the model under the allow-list, refusing files that do not fit it."""
        checkpoint = read_checkpoint(filename, map_location)
        meta = checkpoint.get('meta')
        if isinstance(meta, dict) and 'config' in meta:
            # mmengine's resume runs Config.fromstring on this text (for a GPU-count check): never.
            del meta['config']
            self.logger.info(f"Ignored meta['config'] of {filename}: config text is not executed")
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        model = self.model.module if is_model_wrapper(self.model) else self.model
        check_state_fits(model, checkpoint.get('state_dict', checkpoint), filename)
        _load_checkpoint_to_model(model, checkpoint, strict, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint


def empty_loader_message(dataloader) -> str:
    """Why a training data loader has no batch (too few samples for one batch), and the fix."""
    from mmengine.dist import get_world_size
    num = len(dataloader.dataset)
    world = get_world_size()
    per_process = len(dataloader.sampler) if hasattr(dataloader.sampler, '__len__') else num
    batch_size = dataloader.batch_size or getattr(dataloader.batch_sampler, 'batch_size', None)
    drop_last = getattr(dataloader.batch_sampler, 'drop_last', dataloader.drop_last)
    where = f'{num} samples' + (f' ({per_process} per process over {world})' if world > 1 else '')
    if num == 0 or not drop_last:
        return (f'the training set has {where}: no batch to train on and the checkpoints would '
                'be untrained; check train_dataloader.dataset (data_root, subset_fraction)')
    return (f'the training set has {where}, fewer than one batch of {batch_size} with '
            'drop_last=True: no iteration would run and the checkpoints would be untrained; set '
            f'train_dataloader.batch_size to at most {per_process} or '
            'train_dataloader.drop_last=False (or use more data)')
