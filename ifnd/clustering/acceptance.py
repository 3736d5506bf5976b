"""Acceptance schedules: the share of the samples whose pseudo labels count, growing with training.

IFND accepts the ⌈r·N⌉ most confident pseudo labels, r following a schedule over the epochs
(Sec. 3.2). Pure arithmetic on the schedule's settings: the build-time checks that name the part
and key (``check_acceptance``) and the random-order schedule for any detector stay with the parts
in ``ifnd/models/false_negatives/acceptance.py``.
"""

__all__ = ['ACCEPTANCE_SCHEMES', 'acceptance_rate', 'idle_schedule']

ACCEPTANCE_SCHEMES = ('constant', 'step', 'linear')


def acceptance_rate(epoch: int, max_epochs: int, scheme: str = 'linear', final_rate: float = 1.0,
                    step_epoch: int = 0) -> float:
    """Fraction of the samples to accept at ``epoch``.

    ``'constant'``: ``final_rate``; ``'step'``: 0 before ``step_epoch``, then ``final_rate``;
    ``'linear'``: ``final_rate * epoch / max_epochs`` clamped to ``[0, final_rate]``.
    """
    # The settings the arithmetic cannot take; the parts check types and name their key at build.
    if not isinstance(scheme, str) or scheme not in ACCEPTANCE_SCHEMES:
        raise ValueError(f'acceptance scheme must be one of {ACCEPTANCE_SCHEMES}, got {scheme!r}')
    if not 0.0 <= final_rate <= 1.0:
        raise ValueError(f'acceptance final_rate must be in [0, 1], got {final_rate!r}')
    if step_epoch < 0:
        raise ValueError(f'acceptance step_epoch must be >= 0, got {step_epoch!r}')
    if scheme == 'constant':
        return float(final_rate)
    if scheme == 'step':
        return 0.0 if epoch < step_epoch else float(final_rate)
    if max_epochs <= 0:
        raise ValueError(f'max_epochs must be positive for the linear scheme, got {max_epochs}')
    return float(min(max(final_rate * epoch / max_epochs, 0.0), final_rate))


def idle_schedule(owner: str, max_epochs: int, scheme: str, final_rate: float, step_epoch: int,
                  interval: int) -> str | None:
    """Why a run of ``max_epochs`` ends before the schedule accepts a sample, or None.

    Epoch e trains with the rate of the last update, after ``e - e % interval`` epochs (IFND's
    last clustering round): a step or an interval past the run's end leaves every rate 0.
    """
    for epoch in range(max_epochs):
        if acceptance_rate(epoch - epoch % interval, max_epochs, scheme, final_rate, step_epoch):
            return None
    return (f'{owner} (scheme={scheme!r}, final_rate={final_rate:g}, step_epoch={step_epoch}, '
            f'interval={interval}) accepts no sample before the run ends (train_cfg.max_epochs='
            f'{max_epochs})')
