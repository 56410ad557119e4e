"""Measuring models without training them: sizes, FLOPs, speed, and the paper's figures to compare with.

- ``counting``   exact parameter counts and per-image FLOPs, each number labelled with its convention
- ``reference``  the paper's published accuracies, parameter and FLOP counts, and its pruned heads
- ``tables``     parameter / FLOP rows for a set of variants (``python -m stages.describe``)
- ``speed``      peak matmul FLOP/s, counted training FLOPs, peak memory: the MFU of the benchmarks
"""
