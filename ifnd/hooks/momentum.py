"""Tells a model whose key encoder's momentum follows the iterations (MoCo v3) where the run is."""
from mmengine.hooks import Hook

from ifnd.engine.features import unwrap_model
from ifnd.registry import HOOKS


@HOOKS.register_module()
class MomentumScheduleHook(Hook):
    """Before each training iteration, hands the model the iterations done and the run's total
    (``set_progress``), from which MoCo v3 sets its momentum; logs it as ``momentum``.

    The runner's own counters: a resumed run continues the schedule where it stopped. Models
    without ``set_progress`` are left alone, so the hook sits in every config's ``default_hooks``.
    """

    priority = 'ABOVE_NORMAL'

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """This iteration's place in the run."""
        model = unwrap_model(runner.model)
        set_progress = getattr(model, 'set_progress', None)
        if not callable(set_progress):
            return
        set_progress(runner.iter, runner.max_iters)
        # A host float: logged without a copy to the device.
        runner.message_hub.update_scalar('train/momentum', model.momentum)
