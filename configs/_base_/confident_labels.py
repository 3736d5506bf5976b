# IFND's pseudo labels accepted by their evidence instead of the calendar (docs/methods.md,
# "Acceptance by evidence"): a label counts once its κ is half the way from chance (1/k) to
# certainty, whatever the epoch, and a pair is flagged only where its labels agree at two levels
# or more. Chosen on the Fashion-MNIST protocol's validation split (docs/false_negatives.md); on
# digits, 0.3 of the way was chosen on its protocol's validation split (0.5 accepted almost nothing
# in its 8 epochs). IFND configs take the detector's setting as the preset's (agreement=...); a
# combination the preset does not fix is written with the base's parts (detector=...).
_confident_detector = dict(type='PseudoLabels', agreement=2)
_confident_acceptance = dict(type='ConfidentAcceptance', certainty_share=0.5)
_confident_acceptance_digits = dict(type='ConfidentAcceptance', certainty_share=0.3)
