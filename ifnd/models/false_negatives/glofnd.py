"""GloFND's detector (Balmaseda et al., ICML 2025): a learned similarity threshold per anchor.

Each sample i keeps a threshold λ_i, learned on the fly so that a fraction ``alpha`` (α) of its
negatives over the whole data set lie above it: λ_i is the (1 − α)-quantile of its similarities,
found by minimising ``α·λ + mean_j max(sim_ij − λ, 0)``, whose stochastic gradient on a batch is
``α − (share of the batch's negatives above λ_i)``. Each step updates the λ of the batch's
samples by Adam on that gradient (the authors' optimiser: β = (0.9, 0.98), ε = 1e-8, λ kept in
[−1, 1], λ starts at 1), then flags the negatives whose cosine similarity exceeds the updated λ.
Both start at ``start_epoch``. A sample's two views share its λ, and their negatives count
together. The bias correction uses each sample's own update count (the authors' code counts
epochs, the same thing once updates start at epoch 0).

λ and its Adam state are per-sample buffers: saved in checkpoints, restored on resume, and
updated identically on every process from the gathered batch, so no epoch-end sync is needed.
"""
import torch

from ifnd.dist import gather_no_grad
from ifnd.registry import MODELS

from .detector import DetectorNeeds, FalseNegativeDetector, NegativeBatch
from .sample_state import PerSampleState
from ifnd.settings import check_number


@MODELS.register_module()
class GloFND(FalseNegativeDetector, PerSampleState):
    """Flags the negatives above each anchor's learned threshold λ_i."""

    needs = DetectorNeeds(sample_index=True)

    def __init__(self, alpha: float = 0.01, start_epoch: int = 0, lr: float = 0.05,
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-8,
                 acceptance: dict | None = None) -> None:
        super().__init__(acceptance)
        self.alpha = check_number('GloFND', 'alpha', alpha, low=0, high=1, low_open=True,
                                  high_open=True, hint='the share of negatives taken as false, '
                                  'about 1 / number of classes')
        self.start_epoch = check_number('GloFND', 'start_epoch', start_epoch, int, low=0,
                                        hint='the epoch λ starts learning and flagging at')
        self.lr = check_number('GloFND', 'lr', lr, low=0, low_open=True, hint="λ's learning rate")
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise TypeError(f"GloFND betas must be two floats in [0, 1) (Adam's), got {betas!r}")
        self.betas = tuple(check_number('GloFND', f'betas[{i}]', b, low=0, high=1, high_open=True)
                           for i, b in enumerate(betas))
        self.eps = check_number('GloFND', 'eps', eps, low=0, low_open=True)
        for name, dtype in (('threshold', torch.float32), ('exp_avg', torch.float32),
                            ('exp_avg_sq', torch.float32), ('steps', torch.long)):
            self.register_buffer(name, torch.empty(0, dtype=dtype))

    def setup(self, num_samples: int, max_epochs: int, device: torch.device) -> None:
        """λ = 1 and a fresh Adam state per sample, unless a checkpoint brought them."""
        super().setup(num_samples, max_epochs, device)
        held = self.threshold.numel()
        if held == num_samples:
            return
        if held:
            raise ValueError(f'the GloFND thresholds were saved for {held} samples, the training '
                             f'set has {num_samples}: resume with the data set the run used')
        self.threshold = torch.ones(num_samples, device=device)
        self.exp_avg = torch.zeros(num_samples, device=device)
        self.exp_avg_sq = torch.zeros(num_samples, device=device)
        self.steps = torch.zeros(num_samples, dtype=torch.long, device=device)

    def idle_warnings(self, max_epochs: int) -> list[str]:
        """A ``start_epoch`` past the run's end, besides the acceptance schedule's."""
        warnings = super().idle_warnings(max_epochs)
        if self.start_epoch >= max_epochs:
            warnings.append(f'GloFND start_epoch={self.start_epoch} is not before the run\'s end '
                            f'(train_cfg.max_epochs={max_epochs})')
        return warnings

    @property
    def active(self) -> bool:
        """Whether this epoch updates λ and flags (host-side)."""
        return self.epoch >= self.start_epoch

    def flags(self, batch: NegativeBatch) -> torch.Tensor | None:
        """Negatives above the anchor's updated λ ``[1, A, C]``; None before ``start_epoch``."""
        if not self.active:
            return None
        with torch.no_grad():
            sims = batch.anchors.detach().float() @ batch.candidates.detach().float().t()
            if self.training:
                self.update(sims, batch.negatives, batch.anchor_index, batch.views)
            lam = self.threshold[batch.anchor_index]
            return (sims > lam.unsqueeze(1)).unsqueeze(0)

    @torch.no_grad()
    def update(self, sims: torch.Tensor, negatives: torch.Tensor, index: torch.Tensor,
               views: int) -> None:
        """One Adam step on λ of the batch's samples (all processes' batches, gathered)."""
        lam = self.threshold[index]
        above = ((sims > lam.unsqueeze(1)) & negatives).sum(dim=1).float()
        count = negatives.sum(dim=1).float()
        images = index.view(views, -1)[0]
        above, count = above.view(views, -1).sum(dim=0), count.view(views, -1).sum(dim=0)
        images, above, count = gather_no_grad(images), gather_no_grad(above), gather_no_grad(count)
        grad = self.alpha - above / count.clamp(min=1)
        beta1, beta2 = self.betas
        steps = self.steps[images] + 1
        exp_avg = beta1 * self.exp_avg[images] + (1 - beta1) * grad
        exp_avg_sq = beta2 * self.exp_avg_sq[images] + (1 - beta2) * grad * grad
        corrected = exp_avg / (1 - beta1 ** steps.float())
        scale = (exp_avg_sq / (1 - beta2 ** steps.float())).sqrt() + self.eps
        self.threshold[images] = (self.threshold[images] - self.lr * corrected / scale).clamp(-1, 1)
        self.exp_avg[images], self.exp_avg_sq[images], self.steps[images] = exp_avg, exp_avg_sq, steps

    def log_vars(self, batch: NegativeBatch) -> dict:
        """The batch's mean threshold λ."""
        logged = super().log_vars(batch)
        if self.threshold.numel():
            logged['glofnd_lambda'] = self.threshold[batch.anchor_index].mean()
        return logged
