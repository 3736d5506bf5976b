# IFND's pseudo labels accepted by their evidence instead of the calendar (docs/methods.md,
# "Acceptance by evidence"): a label counts once its κ is half the way from chance (1/k) to
# certainty, whatever the epoch, and a pair is flagged only where its labels agree at two levels
# or more. Chosen on the Fashion-MNIST protocol's validation split (docs/false_negatives.md); on
# digits, 0.3 of the way was chosen on its protocol's validation split (0.5 accepted almost nothing
# in its 8 epochs). IFND configs take the detector's setting as the preset's (agreement=...); a
# combination the preset does not fix is written with the base's parts (detector=...).
_confident_detector = dict(type='PseudoLabels', agreement=2)
_confident_acceptance = dict(type='ConfidentAcceptance', certainty_share=0.5)
# κ's temperature where the share was chosen (the protocols' τ = 0.2): at the Fashion-MNIST
# recipe's loss τ of 0.5, κ could never reach half the way to certainty at k = 100.
_confident_kappa_temperature = 0.2
_confident_acceptance_digits = dict(type='ConfidentAcceptance', certainty_share=0.3)
