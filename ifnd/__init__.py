"""ifnd: self-supervised contrastive learning with Incremental False Negative Detection."""
__version__ = '0.1.0'
