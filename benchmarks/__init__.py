"""Speed, memory and overhead benchmarks (see benchmarks/README.md). Targets live here, never in timed tests.

Scripts (``python -m benchmarks.<name> --help``), each answering a standing question the README's table states:
``train_throughput``, ``truncation``, ``gpu_sharing``, ``train_speed``, ``finding``, ``sweep_scale``,
``trial_fixed_cost``, ``tracking_load``, ``sweep_at_scale`` (our driver against bare Ray Tune at hundreds of trials),
``sweep_concurrency`` (the same at 64 or more trials at once on several Ray nodes, with the MLflow writer's lag),
``analysis_at_scale`` (the analysis stage over a thousand runs: wall time, requests and bytes per run),
``gpsa_cost`` (ConViT's gated heads against the quadratic ones, CPU seconds per epoch, paired), ``mlflow_ui_load``
(the MLflow UI's load time with a thousand runs, in headless Chromium), ``gpu_evidence`` (all of the GPU ones in
one command for a lent GPU machine; ``gpu_evidence.sh`` runs it there) and ``gpu_profile`` (where a training step's
device time goes: busy share, top kernels).

Shared by them: ``common`` (synthetic device data, the reduced CPU size, command-line conventions),
``authors_pattern`` (the authors' way of computing Gaussian attention: the baseline of the GPU speed-up),
``cifar_archive`` (CIFAR-10 archives in the real format, also for the tests), ``gpu_machine`` (what a lent GPU
machine has and which wheels travel to it) and ``step_bisect`` (ten training steps eager, compiled, graphed and
whole-step from the same weights: the first path that departs; the evidence's first section).
"""
