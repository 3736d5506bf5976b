"""False-negative methods under one recipe and several seeds: top-1 with error bars.

Trains SimCLR (instance discrimination), IFND (pseudo labels, elimination), SupCon (attraction
with ground truth), the elimination oracle (Eq. 3 with ground truth), debiased contrastive
learning (Chuang et al., 2020), hard negative sampling (Robinson et al., 2021) and false negative
cancellation (FNC, Huynh et al., 2022; elimination and attraction), GloFND (Balmaseda et al.,
2025) and combinations of parts (IFND or GloFND with hard negatives, the elimination oracle on
IFND's linear schedule) with ``tools/train.py``, one subprocess per method and seed, the same
budget through ``--cfg-options``; ``--methods`` picks any subset. After each pre-training run a linear probe (the linear protocol, frozen backbone,
through ``tools/train.py``) is trained on the same images. The tables give, per method, mean +- sd
over seeds of the final weighted-kNN and linear top-1; the per-seed paired difference to SimCLR
with its mean and a 95 % t-interval; and the share of the SimCLR -> SupCon gap each method
closes, with Fieller's 95 % interval for a ratio of paired means. IFND's MTPR / MTNR (Sec. 4.4)
and acceptance rate per clustering round come from its ``pseudo_labels/rounds.json``; the
precision and recall of the negatives the detecting methods flag, per epoch in the batches
trained on, from the runs' logged ``train/fn_precision`` / ``train/fn_recall``. A picture shows
kNN top-1 over epochs (mean line, sd band), IFND's rounds and the flagging methods' precision and
recall.

``--eval-split val`` holds a class-balanced part of the training split out of training and
evaluates on it: hyper-parameters are chosen that way, never on the test split. ``test`` (the
default) trains on the training split and evaluates on the test split.

Presets:

* ``cpu``: three seeds of every method on a 2-core CPU in about 3 hours with ``--jobs 2`` (10 %
  of Fashion-MNIST, a half-width ResNet-18, 30 epochs; the hyper-parameters, the methods' own
  included, chosen on the val split as README's "Does it work?" section says).
* ``digits``: five seeds of every method on scikit-learn's digits (all 1,347 training images, an
  eighth-width ResNet-18 at 16 pixels, 8 epochs, a 10-epoch probe), about 40 s a run on one
  thread; the methods' own settings chosen on its own val split (docs/false_negatives.md).
* ``gpu``: the configs' own settings (full data, 200 epochs, batch 256, clustering every 5
  epochs, kNN every 10) on one GPU.
* ``gpu-slot``: one seed of SimCLR, IFND, SupCon and the schedule-matched oracle on all of
  Fashion-MNIST in one 8-minute run on one GPU (8 epochs of the full-width ResNet-18, bfloat16,
  views on the GPU, 4 runs at a time, ``--time-limit 480``), the next seed after those of
  ``--previous`` each time; estimated, not measured (docs/false_negatives.md, "On a GPU slot").
  Refused without CUDA unless ``--dry-run`` or ``--rehearse`` (the same runs at toy size on the
  CPU).
* ``vit``: the ViT protocol on a 2-core CPU in about an hour with ``--jobs 2``: SimCLR and MoCo
  v3, IFND on each, SupCon, the schedule-matched oracle and HCSC, three seeds, with a ViT cut to
  4 blocks 96 wide on 4-pixel patches of Fashion-MNIST (5 % of it, 12 epochs; AdamW lr chosen on
  the val split; docs/false_negatives.md, "ViT protocol").
* ``vit-gpu-slot``: one seed of SimCLR and MoCo v3 with and without IFND on all of Fashion-MNIST
  with the configs' ViT-Tiny in one 8-minute GPU run (estimated, not measured); refused and
  rehearsed as ``gpu-slot``.

Any explicit option overrides its preset value. ``--previous FILE.json`` (repeatable) merges the
runs of an earlier ``--out`` result for the methods and seeds not trained here into the tables,
JSON and picture; its settings must be this invocation's but for methods, seeds, work dir, jobs,
threads and the settings of methods not trained here, and every value the tables read is checked
(type and range, e.g. a top-1 in [0, 100]) before any training, naming its path in the file.

Finished runs are kept (``run.json`` in each run's work dir) and not trained again unless their
command changed or ``--rerun`` is given, so an interrupted benchmark continues where it stopped.
``--time-limit SECONDS`` stops the runs still training then, starts none that cannot finish in
the time left, and reports and saves the finished ones.
Example::

    python -m benchmarks.false_negatives --preset cpu --out fn_cpu.json --plot fn_cpu.png
    python -m benchmarks.false_negatives --preset cpu --eval-split val --seeds 0 \\
        --temperature 0.2 --num-clusters 30,100 --work-dir work_dirs/fn_select/t02_k30-100
    python -m benchmarks.false_negatives --preset cpu --eval-split val --seeds 0 \\
        --methods hard_negative --method-options hard_negative:model.beta=4.0 \\
        --work-dir work_dirs/fn_select/hard_b4
    python -m benchmarks.false_negatives --preset gpu --work-dir work_dirs/fn_gpu --amp
    python -m benchmarks.false_negatives --preset gpu-slot --previous fn_slot_1.json \
        --out fn_slot_2.json
    python -m benchmarks.false_negatives --preset digits --jobs 2 --out fn_digits.json
    python -m benchmarks.false_negatives --preset cpu --methods glofnd --previous fn_cpu.json \\
        --out fn_cpu_glofnd.json
"""
import os
import sys

if not __package__:  # started as `python benchmarks/NAME.py`: import the package from the repository
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.fn_harness import *  # noqa: F401,F403  (its API, for callers that import this module)
from benchmarks.fn_harness import main

if __name__ == '__main__':
    main(sys.argv[1:])
