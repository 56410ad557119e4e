"""The analysis stage's library: the manifests' runs from MLflow -> tables, figures and the report.

runs.py (the runs the manifests name, fetched from MLflow; the only module that imports it), study.py (every output
of the stage from a loaded study), table.py (the accuracy table, metrics), figures.py (the paper's figures and those
beyond it), geometry.py (contours, attention distance, Lemma-1 scores), head_motion.py (the finding's numbers),
variants.py (names and labels), palette.py (colours), report.py (the report's text), transform_report.py (the
section on the ResNet18 rebuilt as attention), cka.py (linear CKA) and cka_report.py (its matrices, heat-maps and
section).
"""
