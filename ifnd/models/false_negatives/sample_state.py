"""Per-sample state held by the model: buffers sized by the training set, saved with it."""
from torch import nn


class PerSampleState(nn.Module):
    """A module whose buffers are indexed by sample index and sized by the data set.

    The size is known only once the data set is (a hook fills the buffers), so a checkpoint's
    buffers are adopted with their stored shapes when loading; ``sized_by_data`` tells the
    checkpoint checks that these shapes may differ from a fresh model's.
    """

    sized_by_data = True

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name, buf in self.named_buffers(recurse=False):
            stored = state_dict.get(prefix + name)
            if stored is not None and stored.shape != buf.shape:
                setattr(self, name, buf.new_empty(stored.shape, dtype=stored.dtype))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.after_load()

    def after_load(self) -> None:
        """Refresh host-side copies of the buffers after a checkpoint was loaded."""
