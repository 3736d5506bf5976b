"""The benchmarks, a package run from the repository root: ``python -m benchmarks.step_cost ...``.

Entry points: ``step_cost``, ``clustering_cost``, ``throughput``, ``false_negatives`` (its parts in
``fn_harness``), ``label_quality`` (its tables and picture in ``label_quality_report``) and
``gpu_report``; ``common`` holds what they share.
"""
