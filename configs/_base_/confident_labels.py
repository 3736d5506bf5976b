# IFND's pseudo labels accepted by their evidence instead of the calendar (docs/methods.md,
# "Acceptance by evidence"): a label counts once its κ is half the way from chance (1/k) to
# certainty, whatever the epoch, and a pair is flagged only where its labels agree at two levels
# or more. Chosen on the Fashion-MNIST protocol's validation split (docs/false_negatives.md).
_confident_detector = dict(type='PseudoLabels', agreement=2)
_confident_acceptance = dict(scheme='confidence', threshold=0.5)
