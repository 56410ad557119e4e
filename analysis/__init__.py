"""The analysis stage's library: the runs the manifests name, from MLflow, into tables, figures and the report.

- ``runs``               the runs a study's manifests name, fetched from MLflow (never "the latest runs"; the only
                         module that imports it)
- ``study``              every output of the analysis from a loaded study
- ``variants``           what the analysis shows for each variant: its name, colour, place and the paper's row
- ``table``              the accuracy / size tables, ours beside the paper's
- ``noise``              the binomial intervals of accuracies on the test set's size, and differences within them
- ``head_motion``        the paper's finding as numbers: how far heads travel, how sharp they get
- ``gaussian_locality``  a Gaussian head's grid-independent distance, peak, entropy and mode; degenerate heads; the
                         convolution-like rule
- ``geometry``           where each head looks: Gaussian contours, head tables, locality per epoch
- ``prune_rule``         the prune stage's rule in words
- ``figures``            the paper's figures and those beyond it
- ``palette``            one colour per variant name, everywhere
- ``transform_report``   the section on the trained ResNet18 rebuilt as attention
- ``beyond_paper``       the section on attention that reads the content (ConViT's GPSA) beside the quadratic model
- ``data_size``          the section on accuracy and layer-1 locality against ``train.data_fraction``, per encoding,
                         when the sweep has that axis
- ``cka``                linear CKA (Kornblith et al. 2019); ``cka_report``: its matrices, heat-maps and section
- ``verdicts``           the verdict rules (holds / does not hold / cannot tell) and their statistics, pure functions
- ``claims``             the report's first table: each claim, its verdict by rule, test, setting, runs and compute
- ``band``               the seed band: accuracy's mean and 95 % interval across seeds, the seeds a difference needs
- ``compute``            device-seconds per run (every attempt included), per report table and per claim
- ``report``             ``results/report.md``: the setting, the tables, every figure with a sentence
- ``plots_template``     the page template of ``dvc plots show`` with Vega inlined, so the plots draw offline
"""
