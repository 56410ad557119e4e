"""The analysis stage's library: the runs the manifests name, from MLflow, into tables, figures and the report.

- ``runs``         the runs a study's manifests name, fetched from MLflow (never "the latest runs")
- ``study``        every output of the analysis from a loaded study
- ``variants``     what the analysis shows for each variant: its name, colour, place and the paper's row
- ``table``        the accuracy / size tables, ours beside the paper's
- ``head_motion``  the paper's finding as numbers: how far heads travel, how sharp they get
- ``geometry``     where each head looks: Gaussian contours, head tables, locality per epoch
- ``figures``      the paper's figures and those beyond it
- ``palette``      one colour per variant name, everywhere
- ``report``       ``results/report.md``: the setting, the tables, every figure with a sentence
"""
